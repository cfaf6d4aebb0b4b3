package guard_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// countedStore is a RedisStore on its own client of the shared Redis,
// whose round trips are counted (testenv.CountTrips).
func countedStore(t *testing.T) (*guard.RedisStore, *atomic.Int64) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	s := guardenv.StoreOn(t, c, guard.RedisOptions{})
	return s, testenv.CountTrips(c)
}

func batchItems(scope string, n int) []guard.BatchItem {
	items := make([]guard.BatchItem, n)
	for i := range items {
		items[i] = guard.BatchItem{Key: guard.Key{Scope: scope, ID: fmt.Sprint("k", i)}, Fingerprint: "fp"}
	}
	return items
}

// A batch of fresh keys runs every effect once, in two round trips (the
// claims' pipeline and the completions'); the same batch again replays
// every result in one.
func TestDoBatchRunsOnceThenReplays(t *testing.T) {
	s, trips := countedStore(t)
	g := guard.New(s, guard.Options{})
	items := batchItems("orders", 16)
	var runs [16]atomic.Int32
	fn := func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		runs[i].Add(1)
		if l.Key != items[i].Key || l.Fence != 1 || l.Attempt != 1 || l.Deadline.IsZero() {
			t.Errorf("item %d: lease %+v", i, l)
		}
		return []byte(fmt.Sprint("result ", i)), nil
	}
	before := trips.Load()
	res := g.DoBatch(bg, items, fn, guard.BatchOptions{Concurrency: 4})
	if got := trips.Load() - before; got != 2 {
		t.Errorf("a batch of 16 fresh keys took %d round trips, want 2", got)
	}
	for i, r := range res {
		if r.Err != nil || r.Replayed || string(r.Value) != fmt.Sprint("result ", i) || r.Lease.Key != items[i].Key {
			t.Errorf("item %d: %+v", i, r)
		}
		if runs[i].Load() != 1 {
			t.Errorf("item %d ran %d times", i, runs[i].Load())
		}
		if rec, err := g.Get(bg, items[i].Key); err != nil || rec.State != guard.StateCompleted {
			t.Errorf("item %d: record %+v, %v", i, rec, err)
		}
	}
	before = trips.Load()
	res = g.DoBatch(bg, items, fn, guard.BatchOptions{})
	if got := trips.Load() - before; got != 1 {
		t.Errorf("a batch of 16 completed keys took %d round trips, want 1", got)
	}
	for i, r := range res {
		if r.Err != nil || !r.Replayed || string(r.Value) != fmt.Sprint("result ", i) {
			t.Errorf("replayed item %d: %+v", i, r)
		}
		if runs[i].Load() != 1 {
			t.Errorf("item %d ran %d times", i, runs[i].Load())
		}
	}
}

// One batch of 8 keys: one effect fails, one panics, one calls
// runtime.Goexit, one is rejected, one loses its lease to another holder
// while it runs (the batch goes on extending the others), one runs for
// three leases (kept alive by the batch's heartbeat); the others succeed.
// Each ends as Do would end it, and no other is touched.
func TestDoBatchEachKeyOnItsOwn(t *testing.T) {
	// The batch's claim and each heartbeat round must be answered within
	// a lease on real Redis, or the long item loses its key and the stolen
	// one ends at the deadline rather than on an extension: 300ms was
	// within a stall of a loaded machine.
	const lease = time.Second
	s := realStore(t)
	g := guard.New(s, guard.Options{Lease: lease})
	other := guard.New(s, guard.Options{Lease: time.Minute})
	items := batchItems("mixed", 8)
	const (
		fails = iota
		panics
		exits
		rejects
		stolen
		long
	)
	boom := errors.New("gateway timeout")
	var stolenCause, longCause error
	fn := func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		switch i {
		case fails:
			return nil, boom
		case panics:
			panic(boom)
		case exits:
			runtime.Goexit()
		case rejects:
			return nil, fmt.Errorf("lock taken: %w", guard.ErrRejected)
		case stolen:
			// Another holder takes the key over, as after this holder's
			// lease ran out: the next extension finds the lease lost.
			if err := s.Client().Del(ctx, s.Name(l.Key)).Err(); err != nil {
				t.Error(err)
			}
			if out, err := other.Claim(bg, l.Key, "fp"); err != nil || out.Status != guard.Acquired {
				t.Errorf("takeover: %+v, %v", out, err)
			}
			select {
			case <-ctx.Done():
				stolenCause = context.Cause(ctx)
				return nil, ctx.Err()
			case <-time.After(10 * lease):
				return nil, errors.New("the stolen lease's context did not end")
			}
		case long:
			select {
			case <-ctx.Done():
				longCause = context.Cause(ctx)
				return nil, ctx.Err()
			case <-time.After(3 * lease):
			}
		}
		return []byte(fmt.Sprint("ok ", i)), nil
	}
	res := g.DoBatch(bg, items, fn, guard.BatchOptions{Concurrency: 8})

	state := func(i int) (guard.Record, error) { return g.Get(bg, items[i].Key) }
	if rec, err := state(fails); !errors.Is(res[fails].Err, boom) || err != nil || rec.State != guard.StateFailed || rec.Attempt != 1 {
		t.Errorf("failing item: %v; record %+v, %v; want failed after 1 attempt", res[fails].Err, rec, err)
	}
	var pe *guard.PanicError
	if _, err := state(panics); !errors.As(res[panics].Err, &pe) || !errors.Is(res[panics].Err, boom) || len(pe.Stack) == 0 || !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("panicking item: %v; record: %v; want a *PanicError wrapping the value, the key released", res[panics].Err, err)
	}
	if _, err := state(exits); !errors.Is(res[exits].Err, guard.ErrPanicked) || !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("Goexit item: %v; record: %v; want ErrPanicked, the key released", res[exits].Err, err)
	}
	if _, err := state(rejects); !errors.Is(res[rejects].Err, guard.ErrRejected) || !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("rejected item: %v; record: %v; want ErrRejected, the key released", res[rejects].Err, err)
	}
	// Its context ended when an extension found the lease lost, not
	// later at the lease's deadline.
	if rec, err := state(stolen); !errors.Is(stolenCause, guard.ErrLeaseLost) || !strings.HasPrefix(fmt.Sprint(stolenCause), "extend ") ||
		!errors.Is(res[stolen].Err, guard.ErrLeaseLost) ||
		err != nil || rec.State != guard.StatePending || rec.Fence != 1 || rec.Attempt != 1 {
		t.Errorf("stolen item: cause %v, error %v; record %+v, %v; want lease lost, the new holder's record untouched", stolenCause, res[stolen].Err, rec, err)
	}
	if rec, err := state(long); res[long].Err != nil || longCause != nil || err != nil || rec.State != guard.StateCompleted {
		t.Errorf("long item: %v (cause %v); record %+v, %v; want completed", res[long].Err, longCause, rec, err)
	}
	for i := long + 1; i < len(items); i++ {
		if rec, err := state(i); res[i].Err != nil || string(res[i].Value) != fmt.Sprint("ok ", i) || err != nil ||
			rec.State != guard.StateCompleted || string(rec.Result) != fmt.Sprint("ok ", i) {
			t.Errorf("item %d: %+v; record %+v, %v", i, res[i], rec, err)
		}
	}
	// The failed key runs again, on attempt 2; the released ones afresh.
	again := g.DoBatch(bg, items[:long], func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		if want := map[int]int{fails: 2}[i]; i != stolen && l.Attempt != max(want, 1) {
			t.Errorf("retry of item %d: attempt %d", i, l.Attempt)
		}
		return []byte("retried"), nil
	}, guard.BatchOptions{})
	for i, r := range again {
		switch {
		case i == stolen:
			if !errors.Is(r.Err, guard.ErrInProgress) {
				t.Errorf("retry of the stolen item: %v, want in progress (the other holder has it)", r.Err)
			}
		case r.Err != nil || string(r.Value) != "retried":
			t.Errorf("retry of item %d: %+v", i, r)
		}
	}
}

// A key twice in one batch is claimed the second time only after the
// first ended: the second occurrence replays the first's result.
func TestDoBatchSameKeyTwice(t *testing.T) {
	s, trips := countedStore(t)
	g := guard.New(s, guard.Options{})
	a := guard.BatchItem{Key: guard.Key{Scope: "s", ID: "a"}, Fingerprint: "fp"}
	b := guard.BatchItem{Key: guard.Key{Scope: "s", ID: "b"}, Fingerprint: "fp"}
	other := guard.BatchItem{Key: a.Key, Fingerprint: "other"}
	var runs atomic.Int32
	before := trips.Load()
	res := g.DoBatch(bg, []guard.BatchItem{a, b, a, other}, func(_ context.Context, i int, _ guard.Lease) ([]byte, error) {
		runs.Add(1)
		return []byte(fmt.Sprint(i)), nil
	}, guard.BatchOptions{Concurrency: 2})
	if runs.Load() != 2 || res[0].Err != nil || string(res[0].Value) != "0" || res[1].Err != nil ||
		res[2].Err != nil || !res[2].Replayed || string(res[2].Value) != "0" || !errors.Is(res[3].Err, guard.ErrMismatch) {
		t.Errorf("runs %d, results %+v", runs.Load(), res)
	}
	if got := trips.Load() - before; got != 4 {
		t.Errorf("%d round trips, want 4 (claims and completions of a and b, then a claim round for each repeat of a)", got)
	}
}

// An ordered batch stops at the first item that does not succeed: later
// items do not run, their claims are released.
func TestDoBatchOrdered(t *testing.T) {
	g := realGuard(t, guard.Options{})
	items := batchItems("ordered", 6)
	// Item 1 completed before: a replay does not stop the batch.
	if _, err := g.Do(bg, items[1].Key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("before"), nil }); err != nil {
		t.Fatal(err)
	}
	var order []int
	var mu sync.Mutex
	res := g.DoBatch(bg, items, func(_ context.Context, i int, _ guard.Lease) ([]byte, error) {
		mu.Lock()
		order = append(order, i)
		mu.Unlock()
		if i == 3 {
			return nil, errors.New("declined")
		}
		return []byte("ok"), nil
	}, guard.BatchOptions{Ordered: true, Concurrency: 8})
	if fmt.Sprint(order) != "[0 2 3]" {
		t.Errorf("effects ran in order %v, want [0 2 3]", order)
	}
	if res[0].Err != nil || !res[1].Replayed || res[2].Err != nil || res[3].Err == nil ||
		!errors.Is(res[4].Err, guard.ErrSkipped) || !errors.Is(res[5].Err, guard.ErrSkipped) {
		t.Errorf("results %+v", res)
	}
	for _, i := range []int{4, 5} {
		if _, err := g.Get(bg, items[i].Key); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("skipped item %d: record %v, want released", i, err)
		}
	}
	// A key in progress elsewhere stops the batch too, before anything after it runs.
	held, err := g.Claim(bg, items[4].Key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	order = nil
	res = g.DoBatch(bg, items[3:], func(_ context.Context, i int, _ guard.Lease) ([]byte, error) {
		order = append(order, i+3)
		return []byte("ok"), nil
	}, guard.BatchOptions{Ordered: true})
	if fmt.Sprint(order) != "[3]" || res[0].Err != nil || !errors.Is(res[1].Err, guard.ErrInProgress) || !errors.Is(res[2].Err, guard.ErrSkipped) {
		t.Errorf("order %v, results %+v", order, res)
	}
	_ = g.Release(bg, held.Lease)
}

// MaxRun counts for each key from when its own effect started.
func TestDoBatchMaxRunPerKey(t *testing.T) {
	g := realGuard(t, guard.Options{MaxRun: 300 * time.Millisecond})
	items := batchItems("maxrun", 3)
	var causes [3]error
	start := time.Now()
	res := g.DoBatch(bg, items, func(ctx context.Context, i int, _ guard.Lease) ([]byte, error) {
		if i == 0 {
			time.Sleep(200 * time.Millisecond) // the others wait their turn meanwhile
			return nil, nil
		}
		<-ctx.Done()
		causes[i] = context.Cause(ctx)
		return nil, ctx.Err()
	}, guard.BatchOptions{})
	elapsed := time.Since(start)
	if res[0].Err != nil || !errors.Is(causes[1], guard.ErrMaxRun) || !errors.Is(causes[2], guard.ErrMaxRun) ||
		!errors.Is(causes[1], guard.ErrLeaseLost) {
		t.Errorf("results %+v, causes %v", res, causes)
	}
	if elapsed < 800*time.Millisecond {
		t.Errorf("the batch took %s: MaxRun counted from the batch's start, not each effect's", elapsed)
	}
	// The first extension is due a third of the 30s lease after the
	// claim: an effect cut only then was not cut at its MaxRun.
	if elapsed > 5*time.Second {
		t.Errorf("the batch took %s: an effect's MaxRun, before the first extension, did not set the timer", elapsed)
	}
}

// A MaxRun that ends after the first extension still cuts the effect:
// the timer, set for the extension, sees it then.
func TestDoBatchMaxRunAfterExtension(t *testing.T) {
	// The lease is long enough for the batch claim and each heartbeat to
	// be answered within it on a loaded machine (300ms was not: the
	// effects then end with ErrLeaseLost alone, not ErrMaxRun).
	const maxRun = 2 * time.Second
	g := realGuard(t, guard.Options{Lease: time.Second, MaxRun: maxRun})
	items := batchItems("maxrun-late", 2)
	var causes [2]error
	start := time.Now()
	res := g.DoBatch(bg, items, func(ctx context.Context, i int, _ guard.Lease) ([]byte, error) {
		<-ctx.Done()
		causes[i] = context.Cause(ctx)
		return nil, ctx.Err()
	}, guard.BatchOptions{Concurrency: 2})
	elapsed := time.Since(start)
	for i := range causes {
		if !errors.Is(causes[i], guard.ErrMaxRun) || res[i].Err == nil {
			t.Errorf("item %d: cause %v, result %+v", i, causes[i], res[i])
		}
	}
	if elapsed < maxRun {
		t.Errorf("the batch took %s, less than MaxRun", elapsed)
	}
}

// When the caller's context ends, items whose turn has not come do not
// run: their claims are released and their error wraps the context's.
func TestDoBatchCancelled(t *testing.T) {
	g := realGuard(t, guard.Options{})
	items := batchItems("cancel", 4)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	var ran []int
	res := g.DoBatch(ctx, items, func(ctx context.Context, i int, _ guard.Lease) ([]byte, error) {
		ran = append(ran, i)
		if i == 1 {
			cancel()
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return []byte("ok"), nil
	}, guard.BatchOptions{})
	if fmt.Sprint(ran) != "[0 1]" || res[0].Err != nil || !errors.Is(res[1].Err, context.Canceled) ||
		!errors.Is(res[2].Err, context.Canceled) || !errors.Is(res[3].Err, context.Canceled) {
		t.Errorf("ran %v, results %+v", ran, res)
	}
	for i, want := range []guard.State{guard.StateCompleted, guard.StateFailed, 0, 0} {
		rec, err := g.Get(bg, items[i].Key)
		if want == 0 && !errors.Is(err, guard.ErrNotFound) || want != 0 && rec.State != want {
			t.Errorf("item %d: record %+v, %v; want %v", i, rec, err, want)
		}
	}
}

// slowClaims answers a batch's claims only after a delay, as a slow
// network would.
type slowClaims struct {
	*guard.RedisStore
	delay time.Duration
}

func (s slowClaims) ClaimBatch(ctx context.Context, reqs []guard.ClaimRequest) ([]guard.Outcome, []error) {
	out, errs := s.RedisStore.ClaimBatch(ctx, reqs)
	time.Sleep(s.delay) // the answer arrives late
	return out, errs
}

// Claims answered after the lease's first deadline are not used: every
// acquired key is released and reported unavailable.
func TestDoBatchLateClaims(t *testing.T) {
	s := realStore(t)
	g := guard.New(slowClaims{s, 200 * time.Millisecond}, guard.Options{Lease: 100 * time.Millisecond})
	items := batchItems("late", 3)
	var runs atomic.Int32
	res := g.DoBatch(bg, items, func(context.Context, int, guard.Lease) ([]byte, error) {
		runs.Add(1)
		return nil, nil
	}, guard.BatchOptions{})
	for i, r := range res {
		if !errors.Is(r.Err, guard.ErrUnavailable) || !strings.Contains(r.Err.Error(), "after the lease's deadline") ||
			!strings.Contains(r.Err.Error(), "Options.Lease 100ms") {
			t.Errorf("item %d: %v, want unavailable", i, r.Err)
		}
		if _, err := g.Get(bg, items[i].Key); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("item %d: record %v, want released", i, err)
		}
	}
	if runs.Load() != 0 {
		t.Errorf("%d effects ran", runs.Load())
	}
}

// Effects run one at a time run on the caller's goroutine: an effect that
// calls runtime.Goexit ends it, as it ends Do's caller, once the batch's
// claims are ended as they would have ended: the effect that returned
// completed, the Goexit one and the one whose turn had not come released.
func TestDoBatchGoexitOnCallersGoroutine(t *testing.T) {
	g := realGuard(t, guard.Options{})
	items := batchItems("goexit", 3)
	returned := make(chan bool, 1)
	go func() {
		defer func() { returned <- false }()
		g.DoBatch(bg, items, func(_ context.Context, i int, _ guard.Lease) ([]byte, error) {
			if i == 1 {
				runtime.Goexit()
			}
			return []byte("ok"), nil
		}, guard.BatchOptions{})
		returned <- true
	}()
	if <-returned {
		t.Fatal("DoBatch returned after its effect called runtime.Goexit")
	}
	if rec, err := g.Get(bg, items[0].Key); err != nil || rec.State != guard.StateCompleted {
		t.Errorf("item 0: %+v, %v; want completed", rec, err)
	}
	for _, i := range []int{1, 2} {
		if _, err := g.Get(bg, items[i].Key); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("item %d: %v; want released", i, err)
		}
	}
}

// cancelOnClaim cancels the caller's context while the batch's claims are
// on their way.
type cancelOnClaim struct {
	*guard.RedisStore
	cancel context.CancelFunc
	ended  *error // the claims' context's error once the caller's ended
}

func (s cancelOnClaim) ClaimBatch(ctx context.Context, reqs []guard.ClaimRequest) ([]guard.Outcome, []error) {
	s.cancel()
	select {
	case <-ctx.Done(): // it must not end: claims sent would be abandoned
		*s.ended = ctx.Err()
	case <-time.After(100 * time.Millisecond):
	}
	return s.RedisStore.ClaimBatch(ctx, reqs)
}

// A batch cancelled while its claims are on their way waits for them and
// releases every key they took: nothing is left pending until a lease
// runs out.
func TestDoBatchCancelledDuringClaims(t *testing.T) {
	s := realStore(t)
	ctx, cancel := context.WithCancel(bg)
	var ended error
	g := guard.New(cancelOnClaim{s, cancel, &ended}, guard.Options{})
	items := batchItems("cancel-claims", 4)
	res := g.DoBatch(ctx, items, func(context.Context, int, guard.Lease) ([]byte, error) {
		t.Error("an effect ran after its batch was cancelled")
		return nil, nil
	}, guard.BatchOptions{})
	if ended != nil {
		t.Errorf("the claims' context ended with the caller's (%v): claims already sent would be abandoned", ended)
	}
	for i, r := range res {
		if !errors.Is(r.Err, context.Canceled) {
			t.Errorf("item %d: %v, want canceled", i, r.Err)
		}
		if _, err := g.Get(bg, items[i].Key); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("item %d: record %v, want released", i, err)
		}
	}
}

// perKeyOnly hides a store's batches: DoBatch then makes its per-key
// calls, which count claims here.
type perKeyOnly struct {
	guard.Store
	claims *atomic.Int32
}

func (s perKeyOnly) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	s.claims.Add(1)
	return s.Store.Claim(ctx, req)
}

// A batch whose context has already ended sends no claims, as Do sends
// none: each item reports the context's cause, no effect runs, nothing is
// observed and no key is touched (not even left released). The same holds
// for the round of a repeated key that would start after the context
// ended during the round before it, on a store with batches or without.
func TestDoBatchAlreadyCancelled(t *testing.T) {
	s, trips := countedStore(t)
	var perKeyClaims atomic.Int32
	stores := map[string]guard.Store{"batch": s, "per-key": perKeyOnly{s, &perKeyClaims}}
	for name, store := range stores {
		for _, ordered := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/ordered=%v", name, ordered), func(t *testing.T) {
				var events atomic.Int32
				g := guard.New(store, guard.Options{Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
					events.Add(1)
				})})
				items := batchItems(fmt.Sprintf("precancel-%s-%v", name, ordered), 4)
				cause := errors.New("consumer shutting down")
				ctx, cancel := context.WithCancelCause(bg)
				cancel(cause)
				before, beforeClaims := trips.Load(), perKeyClaims.Load()
				res := g.DoBatch(ctx, items, func(context.Context, int, guard.Lease) ([]byte, error) {
					t.Error("an effect ran in a batch whose context had ended")
					return nil, nil
				}, guard.BatchOptions{Ordered: ordered})
				if got := trips.Load() - before; got != 0 {
					t.Errorf("%d round trips for a batch whose context had ended, want 0", got)
				}
				if got := perKeyClaims.Load() - beforeClaims; got != 0 {
					t.Errorf("%d per-key claims for a batch whose context had ended, want 0", got)
				}
				if n := events.Load(); n != 0 {
					t.Errorf("%d events observed, want 0", n)
				}
				for i, r := range res {
					if !errors.Is(r.Err, cause) || r.Replayed || r.Value != nil {
						t.Errorf("item %d: %+v, want the context's cause", i, r)
					}
					if n := s.Client().Exists(bg, s.Name(items[i].Key)).Val(); n != 0 {
						t.Errorf("item %d: the key exists in Redis: it was claimed", i)
					}
				}

				// A repeated key: its second round would start after the
				// first round's effect ended the context.
				key := guard.Key{Scope: items[0].Key.Scope, ID: "twice"}
				twice := []guard.BatchItem{{Key: key, Fingerprint: "fp"}, {Key: key, Fingerprint: "fp"}}
				ctx, cancel = context.WithCancelCause(bg)
				var ran atomic.Int32
				res = g.DoBatch(ctx, twice, func(context.Context, int, guard.Lease) ([]byte, error) {
					ran.Add(1)
					cancel(cause)
					return []byte("done"), nil
				}, guard.BatchOptions{Ordered: ordered})
				if ran.Load() != 1 || res[0].Err != nil || string(res[0].Value) != "done" {
					t.Errorf("first occurrence: ran %d, %+v", ran.Load(), res[0])
				}
				if !errors.Is(res[1].Err, cause) || res[1].Replayed {
					t.Errorf("second occurrence, after the context ended: %+v, want the context's cause", res[1])
				}
			})
		}
	}
}

// An effect of DoBatch records steps as one of Do does: its lease carries
// the step log, and a later attempt of the key, in a batch too, resumes
// after the steps an earlier one stored instead of running them again.
func TestDoBatchSteps(t *testing.T) {
	g := realGuard(t, guard.Options{})
	items := batchItems("batch-steps", 2)
	var charges, orders atomic.Int32
	attempt := 0
	fn := func(ctx context.Context, i int, l guard.Lease) ([]byte, error) {
		charge, err := guard.Step(ctx, l, "charge", func(context.Context) (string, error) {
			charges.Add(1)
			return fmt.Sprint("ch_", i), nil
		})
		if err != nil {
			return nil, err
		}
		if attempt == 0 {
			return nil, errors.New("order service down")
		}
		orders.Add(1)
		return []byte(charge), nil
	}
	for attempt = range 2 {
		res := g.DoBatch(bg, items, fn, guard.BatchOptions{})
		for i, r := range res {
			if attempt == 0 && (r.Err == nil || !strings.Contains(r.Err.Error(), "order service down")) {
				t.Fatalf("attempt 1, item %d: %v, want the effect's error", i, r.Err)
			}
			if attempt == 1 && (r.Err != nil || string(r.Value) != fmt.Sprint("ch_", i)) {
				t.Fatalf("attempt 2, item %d: %+v", i, r)
			}
		}
	}
	if charges.Load() != 2 || orders.Load() != 2 {
		t.Errorf("%d charges and %d orders for 2 keys, want 2 and 2: the second attempt did not resume", charges.Load(), orders.Load())
	}
}

// panicsOn is a store without batches whose Claim panics for one key: a
// store's bug.
type panicsOn struct {
	guard.Store
	id string
}

func (s panicsOn) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if req.Key.ID == s.id {
		panic("store bug on " + s.id)
	}
	return s.Store.Claim(ctx, req)
}

// A store that panics in a per-key call of a batch panics DoBatch on the
// caller's goroutine, as it panics Do, where the caller can recover it:
// the calls run on goroutines of the batch's, where the panic ended the
// process.
func TestDoBatchStorePanicReachesCaller(t *testing.T) {
	s, _ := countedStore(t)
	items := batchItems("store-panic", 8)
	g := guard.New(panicsOn{s, items[5].Key.ID}, guard.Options{})
	got := func() (p any) {
		defer func() { p = recover() }()
		g.DoBatch(bg, items, func(context.Context, int, guard.Lease) ([]byte, error) {
			t.Error("an effect ran in a batch whose claims panicked")
			return nil, nil
		}, guard.BatchOptions{})
		return nil
	}()
	if got == nil || !strings.Contains(fmt.Sprint(got), "store bug on "+items[5].Key.ID) {
		t.Fatalf("DoBatch over a panicking store: recovered %v, want the store's panic", got)
	}
}

// DoBatch observes each item's claim as Do does (the same events, with
// the same attempts: a fresh key acquired, one whose holder's lease ran
// out recovered and acquired, a completed one replayed, one held by
// another holder in progress, another payload a mismatch), and gives each
// acquired lease its deadline, as Do's lease has.
func TestDoBatchObservesAsDo(t *testing.T) {
	s, mr := miniStore(t)
	var (
		mu     sync.Mutex
		events = map[string][]string{} // by key ID, in order
	)
	g := guard.New(s, guard.Options{Lease: 30 * time.Second, Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		mu.Lock()
		defer mu.Unlock()
		events[e.Key.ID] = append(events[e.Key.ID], fmt.Sprintf("%s %d", e.Kind, e.Attempt))
	})})
	ids := []string{"fresh", "crashed", "done", "busy", "other-payload"}
	for _, scope := range []string{"do", "batch"} {
		if _, err := g.Claim(bg, guard.Key{Scope: scope, ID: "crashed"}, "fp"); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Do(bg, guard.Key{Scope: scope, ID: "done"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			return []byte("v"), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	mr.FastForward(31 * time.Second) // the crashed holders' leases run out
	for _, scope := range []string{"do", "batch"} {
		if _, err := g.Claim(bg, guard.Key{Scope: scope, ID: "busy"}, "fp"); err != nil {
			t.Fatal(err)
		}
		if _, err := g.Claim(bg, guard.Key{Scope: scope, ID: "other-payload"}, "fp"); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	clear(events)
	mu.Unlock()
	fp := func(id string) string {
		if id == "other-payload" {
			return "another fp"
		}
		return "fp"
	}
	effect := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		if d, ok := ctx.Deadline(); ok && !d.IsZero() {
			return nil, errors.New("the effect's context reports a deadline")
		}
		if lease.Deadline.IsZero() || lease.Deadline.Before(time.Now()) {
			return nil, fmt.Errorf("lease deadline %v", lease.Deadline)
		}
		return []byte("ran"), nil
	}
	answer := func(res guard.Result, err error) string {
		return fmt.Sprintf("%q replayed=%v in-progress=%v mismatch=%v err=%v", res.Value, res.Replayed,
			errors.Is(err, guard.ErrInProgress), errors.Is(err, guard.ErrMismatch), err != nil)
	}
	doRes := map[string]string{}
	for _, id := range ids {
		res, err := g.Do(bg, guard.Key{Scope: "do", ID: id}, fp(id), effect)
		doRes[id] = answer(res, err)
	}
	doEvents := map[string][]string{}
	mu.Lock()
	for id, evs := range events {
		doEvents[id] = evs
	}
	clear(events)
	mu.Unlock()

	items := make([]guard.BatchItem, len(ids))
	for i, id := range ids {
		items[i] = guard.BatchItem{Key: guard.Key{Scope: "batch", ID: id}, Fingerprint: fp(id)}
	}
	for i, r := range g.DoBatch(bg, items, func(ctx context.Context, _ int, lease guard.Lease) ([]byte, error) {
		return effect(ctx, lease)
	}, guard.BatchOptions{}) {
		id := ids[i]
		if got := answer(r.Result, r.Err); got != doRes[id] {
			t.Errorf("%s: DoBatch answered %s (%v), Do %s", id, got, r.Err, doRes[id])
		}
		if (id == "fresh" || id == "crashed") && (r.Err != nil || r.Lease.Deadline.IsZero()) {
			t.Errorf("%s: %v, lease deadline %v; want it run under a lease with its deadline", id, r.Err, r.Lease.Deadline)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if got, want := events[id], doEvents[id]; !slices.Equal(got, want) {
			t.Errorf("%s: DoBatch observed %q, Do %q", id, got, want)
		}
	}
	if want := []string{"recovered 2", "acquired 2", "completed 2"}; !slices.Equal(doEvents["crashed"], want) {
		t.Errorf("crashed: Do observed %q, want %q", doEvents["crashed"], want)
	}
}
