package proof

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/wait"
)

// workload says how much a nemesis run does.
type workload struct {
	Seed    uint64
	Ops     int           // top-level operations (Do, manual claim, get, probe)
	Keys    int           // distinct keys
	Workers int           // goroutines
	Lease   time.Duration // the guard's lease
	Faults  []FaultKind   // nemesis faults; default DefaultFaults
	// Pipelined sends every single store call through the client's
	// autopipeliner, so a lost reply makes go-redis re-send a whole
	// pipeline of other workers' scripts (a batch's calls always go as
	// a pipeline of their own, re-sent whole alike).
	Pipelined bool
}

// stats counts what a run saw, to show the faults bit.
type stats struct {
	ops, unknown, lost, recovered, replays, inProgress, fnErrors, panics, manual, long, batches, exhausted atomic.Int64
}

func (s *stats) String() string {
	return fmt.Sprintf("ops=%d unknown=%d lost=%d recovered=%d replays=%d in_progress=%d fn_errors=%d panics=%d manual=%d long=%d batches=%d exhausted=%d",
		s.ops.Load(), s.unknown.Load(), s.lost.Load(), s.recovered.Load(), s.replays.Load(), s.inProgress.Load(),
		s.fnErrors.Load(), s.panics.Load(), s.manual.Load(), s.long.Load(), s.batches.Load(), s.exhausted.Load())
}

// longLease is the lease of the long effects: they outlive several
// heartbeats under faults, lose their lease when extensions fail, and are
// taken over by the next claim. At a second the margin (12ms) is well
// above this machine's scheduling noise; at the workload's 300ms (5ms) it
// is not, under -race and faults.
const longLease = time.Second

var (
	errTransient = errors.New("transient business failure")
	errEffect    = errors.New("business effect failed") // e.g. its transaction cancelled with the lease
)

// runNemesis runs w against the shared Redis through a faulty proxy and
// PostgreSQL, then lets every key settle without faults and checks: the
// history is linearizable, no two holders of a key acted at once (every
// effect run by Do honours its context; see Windows), each key has
// exactly one business row, and the stored result is that row's value.
func runNemesis(t *testing.T, w workload) {
	test := "TestNemesisLinearizable$"
	if w.Pipelined {
		test = "TestNemesisLinearizablePipelined"
	}
	reproduce := fmt.Sprintf("reproduce the fault schedule with: go test -race ./proof -run '%s' -seed=%d", test, w.Seed)
	bk := newBank(t)
	proxy := startProxy(t, testenv.RedisAddr(t))
	client := faultyClient(t, proxy.Addr(), 2*w.Workers)
	opts := guard.RedisOptions{Prefix: testenv.Prefix(t), Unpipelined: true}
	if w.Pipelined {
		opts = guard.RedisOptions{Prefix: opts.Prefix, DirectCalls: -1}
	}
	rec := NewRecorder(guardenv.StoreOn(t, client, opts))
	rec.CallTimeout = w.Lease / 2 // see TestClaimRetriedAfterItsLeaseRanOut
	g := guard.New(rec, guard.Options{Lease: w.Lease, TTL: time.Hour})
	// The long effects' keys are not in the recorded history (their calls
	// cut off by partitions would leave porcupine too many unknowns): the
	// windows check judges them. Half their runs go through a proxy of
	// their own that is partitioned now and then for about a lease.
	cutProxy := startProxy(t, testenv.RedisAddr(t))
	longOpts := guard.Options{Lease: longLease, TTL: time.Hour}
	gLong := [2]*guard.Guard{
		guard.New(guardenv.StoreOn(t, client, opts), longOpts),
		guard.New(guardenv.StoreOn(t, faultyClient(t, cutProxy.Addr(), 8), opts), longOpts),
	}
	wins := NewWindows()
	scope := "nemesis-" + strconv.FormatUint(w.Seed, 10)
	keys := make([]guard.Key, w.Keys)
	for i := range keys {
		keys[i] = guard.Key{Scope: scope, ID: fmt.Sprintf("k%02d", i)}
	}
	fp := func(k guard.Key) string { return "fp-" + k.ID }
	// Keys of the long effects, which work for a while and then fail, so
	// they run again and again through the faults, losing leases and
	// taking them over.
	leaseKeys := make([]guard.Key, 4)
	for i := range leaseKeys {
		leaseKeys[i] = guard.Key{Scope: scope + "-lease", ID: fmt.Sprintf("l%d", i)}
	}

	// Keys that never complete: claimed with a limit on attempts and
	// failed, released or left to expire, until the limits run out.
	exhaustKeys := make([]guard.Key, 4)
	for i := range exhaustKeys {
		exhaustKeys[i] = guard.Key{Scope: scope + "-exhaust", ID: fmt.Sprintf("x%d", i)}
	}

	// Keys whose effects run in steps (nemesis_steps_test.go).
	stepKeys, stepVals := stepNemesisKeys(scope), newStepValues()

	nem := NewNemesis(proxy, NemesisOptions{Seed: w.Seed, Faults: w.Faults})
	bitten := Bites() // the toxics' hits so far in this process
	nctx, stopNemesis := context.WithCancel(context.Background())
	nemDone := make(chan error, 2)
	go func() { nemDone <- nem.Run(nctx) }()
	cuts := NewNemesis(cutProxy, NemesisOptions{Seed: w.Seed, Faults: []FaultKind{Partition},
		MinGap: 100 * time.Millisecond, MaxGap: 400 * time.Millisecond, MinHold: longLease * 3 / 5, MaxHold: longLease * 9 / 5, MaxAtOnce: 1})
	go func() { nemDone <- cuts.Run(nctx) }()

	var st stats
	var next atomic.Int64
	began := time.Now()
	var wg sync.WaitGroup
	for wid := range w.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(w.Seed, uint64(wid)))
			ctx := WithClient(context.Background(), wid)
			seen := map[guard.Key]bool{} // keys this worker saw completed
			for next.Add(1) <= int64(w.Ops) {
				st.ops.Add(1)
				k := keys[r.IntN(len(keys))]
				switch p := r.IntN(100); {
				case p < 3:
					longRun(ctx, t, gLong[r.IntN(2)], wins, leaseKeys[r.IntN(len(leaseKeys))], r, &st)
				case p < 6: // nemesis_batch_test.go: the batch path
					longBatch(ctx, t, gLong[r.IntN(2)], wins, leaseKeys, r, &st)
				case p < 16:
					stepsOnce(ctx, t, g, stepVals, stepKeys[r.IntN(len(stepKeys))], r, &st)
				case p < 28:
					for _, k := range doBatch(ctx, t, g, wins, bk, keys, fp, r, &st) {
						seen[k] = true
					}
				case p < 65:
					if res, ok := doOnce(ctx, t, g, wins, bk, k, fp(k), r, &st); ok {
						seen[k] = true
						if res.Replayed {
							st.replays.Add(1)
						}
					}
				case p < 80:
					st.manual.Add(1)
					manualClaim(ctx, g, bk, k, fp(k), w.Lease, r, &st)
				case p < 85: // nemesis_batch_test.go: completions of lost leases, batched
					st.manual.Add(1)
					manualBatch(ctx, g, rec, bk, keys, fp, w.Lease, r, &st)
				case p < 92:
					_, _ = g.Get(ctx, k)
				case p < 95:
					exhaustOnce(ctx, g, exhaustKeys[r.IntN(len(exhaustKeys))], w.Lease, r, &st)
				default:
					// A different payload under a key seen completed must
					// learn nothing and change nothing.
					if seen[k] {
						out, err := g.Claim(ctx, k, "other-payload")
						if err == nil || (!errors.Is(err, guard.ErrMismatch) && !errors.Is(err, guard.ErrUnavailable)) {
							t.Errorf("claim of completed %s with another fingerprint: %+v, %v; want mismatch", k, out, err)
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	ran := time.Since(began)
	stopNemesis()
	for range 2 {
		if err := <-nemDone; err != nil {
			t.Fatalf("nemesis: %v", err)
		}
	}

	// No faults now: every key must reach completed with one effect.
	ctx := WithClient(context.Background(), w.Workers)
	settling := time.Now()
	for _, k := range keys {
		settle(t, ctx, g, k, fp(k), bk.effect(fp(k), 0), 10*w.Lease+5*time.Second)
	}
	settled := time.Since(settling)

	applied := nem.Applied()
	reproduceFail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		t.Errorf("%s", reproduce)
	}
	settleStepKeys(t, ctx, g, rec, stepKeys, stepVals, &st, 10*w.Lease+5*time.Second, reproduceFail)
	// Every key left to expire can be taken again: a store that never
	// recovered a dead holder's key would leave one stuck here.
	for _, k := range exhaustKeys {
		settleExhaustKey(t, ctx, g, k, 10*w.Lease+5*time.Second, &st)
	}
	ps := client.PoolStats()
	t.Logf("toxic hits so far in this process: %v", Bites())
	t.Logf("seed %d: %s; %d faults applied; %d calls recorded; %d connections opened; workload %s, settling %s",
		w.Seed, &st, len(applied), len(rec.History()), ps.Misses, ran.Round(time.Millisecond), settled.Round(time.Millisecond))
	if len(applied) == 0 {
		t.Errorf("the nemesis applied no fault")
	}
	// The faults must be seen to bite, and to cost the calls something:
	// a nemesis whose toxics pass everything through (or a proxy that is
	// not in the path) makes every check below pass for nothing. Other
	// runs in this process may add hits, never take them away.
	hits := int64(0)
	for kind, n := range Bites() {
		hits += n - bitten[kind]
	}
	if hits == 0 || st.unknown.Load()+st.lost.Load() == 0 {
		t.Errorf("%d toxic hits in this run, %d calls of unknown outcome, %d lost leases: the faults did not reach the calls",
			hits, st.unknown.Load(), st.lost.Load())
	}
	if st.recovered.Load() == 0 {
		t.Errorf("no claim took over a dead holder's key: the run proves nothing about recovery")
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
		t.Errorf("%s\nfaults applied:\n%s", reproduce, strings.Join(applied, "\n"))
	}

	nw, cut := wins.Count()
	t.Logf("effect windows: %d, %d cut short by their context; partitions of the long effects' proxy: %d", nw, cut, len(cuts.Applied()))
	if o := wins.Overlaps(); len(o) > 0 {
		fail("%d pairs of holders acted at once, though each honours its context:\n%s", len(o), strings.Join(o, "\n"))
	}

	checking := time.Now()
	res, path, err := Check(rec.History(), time.Minute)
	t.Logf("linearizability check: %s in %s", res, time.Since(checking).Round(time.Millisecond))
	if err != nil {
		t.Error(err)
	}
	if res != porcupine.Ok {
		fail("history is %s (not linearizable), visualisation: %s\n%s", res, path, Explain(rec.History(), time.Minute))
	}

	rows := bk.rows(t, scope)
	for _, k := range keys {
		got, err := g.Get(ctx, k)
		if err != nil || got.State != guard.StateCompleted {
			fail("%s: %+v, %v after settling; want completed", k, got, err)
			continue
		}
		if vs := rows[k.ID]; len(vs) != 1 {
			fail("%s has %d business rows %q, want exactly 1", k, len(vs), vs)
		} else if string(got.Result) != vs[0] {
			fail("%s: stored result %q, business row %q", k, got.Result, vs[0])
		}
	}
	if len(rows) != len(keys) {
		fail("business rows for %d keys, want %d", len(rows), len(keys))
	}
}

// longRun runs Guard.Do on one of the long effects' keys: the effect acts
// every 2ms while its context is live for 0.5-2.5 long leases, so its
// heartbeat meets the faults (and, through the cut proxy, partitions),
// then fails (the key runs again).
func longRun(ctx context.Context, t *testing.T, g *guard.Guard, wins *Windows, k guard.Key, r *rand.Rand, st *stats) {
	work := longLease/2 + time.Duration(r.Int64N(int64(2*longLease)))
	_, err := g.Do(ctx, k, "fp-long", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		st.long.Add(1)
		win := wins.Open(l)
		defer win.Close()
		if l.Recovered {
			st.recovered.Add(1)
		}
		if !win.Steps(ctx, work, 2*time.Millisecond) {
			return nil, context.Cause(ctx)
		}
		return nil, errTransient
	})
	countErr(st, err)
	switch {
	case errors.Is(err, errTransient), errors.Is(err, guard.ErrInProgress), errors.Is(err, guard.ErrUnavailable),
		errors.Is(err, guard.ErrLeaseLost):
	default:
		t.Errorf("long run on %s: unexpected error %v", k, err)
	}
}

// doOnce runs Guard.Do with the business effect, sometimes failing or
// panicking before the effect. Every run records its window in wins, up
// to its last check of its context before the business transaction
// (which its context and the backstop row guard).
func doOnce(ctx context.Context, t *testing.T, g *guard.Guard, wins *Windows, bk *bank, k guard.Key, fp string, r *rand.Rand, st *stats) (res guard.Result, ok bool) {
	mode := r.IntN(100)
	think := time.Duration(r.IntN(10)) * time.Millisecond
	effect := bk.effect(fp, 0)
	fn := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		win := wins.Open(l)
		defer win.Close()
		if l.Recovered {
			st.recovered.Add(1)
		}
		if !wait.For(ctx, think) || !win.Live(ctx) {
			return nil, context.Cause(ctx)
		}
		switch {
		case mode < 8:
			return nil, errTransient
		case mode < 11:
			panic(errTransient)
		}
		v, err := effect(ctx, l)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errEffect, err)
		}
		return v, nil
	}
	defer func() {
		if p := recover(); p != nil {
			if p != errTransient {
				panic(p)
			}
			st.panics.Add(1)
		}
	}()
	res, err := g.Do(ctx, k, fp, fn)
	countErr(st, err)
	switch {
	case err == nil:
		return res, true
	case errors.Is(err, errTransient), errors.Is(err, errEffect):
		st.fnErrors.Add(1)
	case errors.Is(err, guard.ErrInProgress), errors.Is(err, guard.ErrUnavailable),
		errors.Is(err, guard.ErrLeaseLost), errors.Is(err, context.Canceled):
	default:
		t.Errorf("Do %s: unexpected error %v", k, err)
	}
	return res, false
}

func countErr(st *stats, err error) {
	switch {
	case err == nil:
	case errors.Is(err, guard.ErrInProgress):
		st.inProgress.Add(1)
	case errors.Is(err, guard.ErrLeaseLost):
		st.lost.Add(1)
	case errors.Is(err, guard.ErrUnavailable):
		st.unknown.Add(1)
	}
}

// manualClaim claims without Do's heartbeat and sometimes holds the key
// past its lease before finishing, so late completions race recoveries.
func manualClaim(ctx context.Context, g *guard.Guard, bk *bank, k guard.Key, fp string, lease time.Duration, r *rand.Rand, st *stats) {
	out, err := g.Claim(ctx, k, fp)
	countErr(st, err)
	if err != nil || out.Status != guard.Acquired {
		return
	}
	l := out.Lease
	if l.Recovered {
		st.recovered.Add(1)
	}
	hold := time.Duration(r.IntN(10)) * time.Millisecond
	if r.IntN(3) == 0 {
		hold = lease + time.Duration(r.Int64N(int64(lease/2))) // outlive the lease: a paused process
	}
	time.Sleep(hold) // the holder working (or paused) for this long
	switch p := r.IntN(10); {
	case p < 6:
		v, err := bk.effect(fp, 0)(ctx, l)
		if err != nil {
			countErr(st, g.Fail(ctx, l, err))
			return
		}
		countErr(st, g.Complete(ctx, l, v))
	case p < 8:
		countErr(st, g.Release(ctx, l))
	default:
		countErr(st, g.Fail(ctx, l, errTransient))
	}
}

// exhaustOnce claims k, a key that never completes, with a limit of two to
// six attempts of its own (callers with different limits see their own:
// guard.CallOptions), and ends an acquired claim by failing or releasing
// it, by abandoning it (a lease that runs out: a failure counted by the
// claim that finds it), or by extending it and failing after its lease. Every EXHAUSTED answer, its count and its last error, and
// the "lease expired" failure an exhausted claim records, are checked
// against the model.
func exhaustOnce(ctx context.Context, g *guard.Guard, k guard.Key, lease time.Duration, r *rand.Rand, st *stats) {
	out, err := g.ClaimWith(ctx, k, "fp-exhaust", guard.CallOptions{MaxAttempts: 2 + r.IntN(5)})
	countErr(st, err)
	if errors.Is(err, guard.ErrExhausted) {
		st.exhausted.Add(1)
	}
	if err != nil || out.Status != guard.Acquired {
		return
	}
	if out.Lease.Recovered {
		st.recovered.Add(1)
	}
	switch p := r.IntN(10); {
	case p < 2:
		// The holder died: its lease runs out.
	case p < 3:
		// The holder paused past its lease, then its heartbeat woke up:
		// the key taken over meanwhile, it must hear LOST and push out no
		// one's lease.
		time.Sleep(lease + time.Duration(r.Int64N(int64(lease/2))))
		countErr(st, g.Extend(ctx, out.Lease))
		countErr(st, g.Fail(ctx, out.Lease, errTransient))
	case p < 5:
		countErr(st, g.Release(ctx, out.Lease))
	default:
		time.Sleep(time.Duration(r.IntN(5)) * time.Millisecond)
		countErr(st, g.Fail(ctx, out.Lease, errTransient))
	}
}

// settleExhaustKey claims k, without faults, until the claim is acquired
// (then released) or the key is exhausted, within limit: a key whose
// holder died is taken over once its lease ran out.
func settleExhaustKey(t *testing.T, ctx context.Context, g *guard.Guard, k guard.Key, limit time.Duration, st *stats) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out, err := g.ClaimWith(ctx, k, "fp-exhaust", guard.CallOptions{MaxAttempts: 1 << 20})
		switch {
		case err == nil && out.Status == guard.Acquired:
			if out.Lease.Recovered {
				st.recovered.Add(1)
			}
			if err := g.Release(ctx, out.Lease); err != nil {
				t.Errorf("release of %s while settling: %v", k, err)
			}
			return
		case errors.Is(err, guard.ErrExhausted):
			return
		case time.Now().After(deadline):
			t.Errorf("%s was not taken again within %s: %+v, %v", k, limit, out, err)
			return
		}
		time.Sleep(5 * time.Millisecond) // polling a key whose lease is running out
	}
}

var seedFlag = flag.Uint64("seed", 0, "run the nemesis tests with this seed only")

// nemesisSeeds are the seeds make test runs (1–5); -seed picks one; -soak
// runs seeds 1–40 with 10,000 operations each.
func nemesisSeeds() []uint64 {
	if *seedFlag != 0 {
		return []uint64{*seedFlag}
	}
	seeds := []uint64{1, 2, 3, 4, 5}
	if *soak {
		for s := uint64(6); s <= 40; s++ {
			seeds = append(seeds, s)
		}
	}
	return seeds
}

// 2,000 operations over 50 keys by 16 goroutines, under latency, resets,
// dropped and truncated replies and bandwidth limits, for each seed: the
// history is linearizable and every key has exactly one business row.
func TestNemesisLinearizable(t *testing.T) { testNemesis(t, false) }

// The same with every store call pipelined: a fault on one connection
// fails, and go-redis re-sends, the scripts of several workers at once.
func TestNemesisLinearizablePipelined(t *testing.T) { testNemesis(t, true) }

func testNemesis(t *testing.T, pipelined bool) {
	if os.Getenv(childEnv) != "" {
		t.Skip("child process")
	}
	for _, seed := range nemesisSeeds() {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			ops := 2000
			if *soak {
				ops = 10000
			}
			runNemesis(t, workload{Seed: seed, Ops: ops, Keys: 50, Workers: 16, Lease: 300 * time.Millisecond, Pipelined: pipelined})
		})
	}
}
