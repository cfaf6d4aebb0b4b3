package proof

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/wait"
)

// These tests cut a holder off from Redis while its effect runs, the way
// a partition or a paused server does, and let another claimant take the
// key as soon as the server lets it. The holder's effect honours its
// context: it acts every 2ms, asking its context first. They count
// overlapping executions (the holder's last action made with its context
// live after the other's effect began, which is as soon as its claim
// succeeded) and check that the holder's context had ended before the
// other claim succeeded.

// hookStore is a real store that calls hooks around the holder's
// extensions: to start a fault at a chosen point of the heartbeat.
type hookStore struct {
	guard.Store
	beforeExtend func() // before each extension is sent
	afterExtend  func() // after each extension that succeeded
}

func (h *hookStore) Extend(ctx context.Context, l guard.Lease, d time.Duration) error {
	if h.beforeExtend != nil {
		h.beforeExtend()
	}
	err := h.Store.Extend(ctx, l, d)
	if err == nil && h.afterExtend != nil {
		h.afterExtend()
	}
	return err
}

// trial is what one holder and one claimant of a key saw.
type trial struct {
	startA time.Time // the holder's effect began
	lastA  time.Time // its last action, made with its context live
	endA   time.Time // it observed its context's cancellation
	startB time.Time // the claimant's claim succeeded (its effect began)
	// aLiveAtB: the holder's context was still live when the claimant's
	// claim succeeded.
	aLiveAtB bool
	errA     error // the holder's Do
}

func (tr trial) overlaps() bool { return tr.lastA.After(tr.startB) }

// holder runs Do on key with an effect that acts every 2ms as long as its
// context is live, and reports its window and its context (through got,
// as soon as it runs).
func holder(ctx context.Context, g *guard.Guard, key guard.Key, tr *trial, got chan<- *context.Context) {
	_, tr.errA = g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		tr.startA = time.Now()
		got <- &ctx
		for {
			now := time.Now() // before asking: the action is no later than the answer
			if ctx.Err() != nil {
				tr.endA = time.Now()
				return nil, context.Cause(ctx)
			}
			tr.lastA = now
			wait.For(ctx, 2*time.Millisecond)
		}
	})
}

// claimant runs Do on key until its effect runs, retrying as soon as the
// server's answer allows, and records when it ran and whether a's context
// was live then.
func claimant(t *testing.T, g *guard.Guard, key guard.Key, a *context.Context, tr *trial, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		_, err := g.Do(context.Background(), key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			tr.startB = time.Now()
			tr.aLiveAtB = (*a).Err() == nil
			return []byte("b"), nil
		})
		if err == nil {
			if tr.startB.IsZero() {
				return errors.New("the claimant replayed a result: the holder completed")
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: the claimant did not get the key within %s: %w", key, limit, err)
		}
		// Wait for the holder's lease as the server reports it, then poll
		// closely: the claim should succeed the moment the server allows.
		wait := 2 * time.Millisecond
		var ip *guard.InProgressError
		if errors.As(err, &ip) {
			wait = max(ip.RetryAfter-30*time.Millisecond, wait)
		} else if !errors.Is(err, guard.ErrUnavailable) {
			return fmt.Errorf("%s: claimant: %w", key, err)
		}
		time.Sleep(wait) // waiting for the server's lease to run out
	}
}

// report sums up trials for the log and fails the test on an overlap or
// a claim that succeeded while the holder's context was live.
func report(t *testing.T, name string, trials []trial) {
	t.Helper()
	overlaps, live, lateSeen := 0, 0, 0
	var gaps []time.Duration
	for _, tr := range trials {
		if tr.overlaps() {
			overlaps++
		}
		if tr.aLiveAtB {
			live++
		}
		if tr.endA.After(tr.startB) {
			lateSeen++
		}
		gaps = append(gaps, tr.startB.Sub(tr.lastA))
	}
	slices.Sort(gaps)
	t.Logf("%s: %d trials, %d overlapping executions, %d claims succeeded while the holder's context was live; "+
		"the holder's last action came before the other's effect began by min %s, median %s, max %s "+
		"(%d holders were scheduled to see their cancellation only after that)",
		name, len(trials), overlaps, live, gaps[0].Round(time.Microsecond), gaps[len(gaps)/2].Round(time.Microsecond),
		gaps[len(gaps)-1].Round(time.Microsecond), lateSeen)
	if overlaps > 0 || live > 0 {
		t.Errorf("%s: %d overlapping executions and %d claims while the holder was live, want 0", name, overlaps, live)
	}
}

// A holder's connection starts dropping every byte it sends, either as
// its first extension goes out or right after that extension succeeded;
// another client claims the key as soon as the server lets it. The
// holder's context always ends first: 0 overlaps. Both with the README's
// client (go-redis defaults: no context deadlines on the socket, 3s read
// timeout, 3 retries) and with ContextTimeoutEnabled. In the slow-*
// variants every reply takes 40ms to come back, more than the margin
// (22ms at a 2s lease): a deadline counted from when the claim or
// extension returned, rather than from when it was sent, lets the other
// claim in first.
func TestPartitionedHolderStopsFirst(t *testing.T) {
	const lease = 2 * time.Second
	trials, batch := 16, 16
	if *soak {
		trials = 200
	}
	snapshot := goleak.IgnoreCurrent()
	prefix := testenv.Prefix(t)
	direct := testenv.Redis(t)
	gB := guard.New(guardenv.StoreOn(t, direct, guard.RedisOptions{Prefix: prefix}), guard.Options{Lease: lease})
	clients := map[string]redis.Options{
		"readme-client":           {},
		"context-timeout-enabled": {ContextTimeoutEnabled: true},
	}
	for _, cname := range []string{"readme-client", "context-timeout-enabled"} {
		modes := []string{"first-extension-lost", "after-first-extension", "slow-first-extension-lost", "slow-after-first-extension"}
		if cname != "readme-client" {
			modes = modes[:2]
		}
		for _, when := range modes {
			name := cname + "/" + when
			results := make([]trial, trials)
			for lo := 0; lo < trials; lo += batch {
				var wg sync.WaitGroup
				for i := lo; i < min(lo+batch, trials); i++ {
					wg.Go(func() {
						if err := partitionTrial(t, name, i, clients[cname], when, prefix, gB, lease, &results[i]); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
			}
			if t.Failed() {
				return
			}
			report(t, name, results)
		}
	}
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
}

func partitionTrial(t *testing.T, name string, i int, copts redis.Options, when, prefix string, gB *guard.Guard, lease time.Duration, tr *trial) error {
	proxy, err := NewProxy(testenv.RedisAddr(t))
	if err != nil {
		return err
	}
	defer proxy.Close()
	copts.Addr = proxy.Addr()
	ca := redis.NewClient(&copts)
	defer ca.Close()
	sa := guard.NewRedisStore(ca, guard.RedisOptions{Prefix: prefix})
	if err := sa.LoadScripts(context.Background()); err != nil {
		return err
	}
	partitioned := make(chan struct{})
	var once sync.Once
	cut := func() {
		once.Do(func() {
			// A black hole for what the holder sends: nothing reaches Redis,
			// nothing comes back, the link stays open.
			if _, err := proxy.Add(Fault{Type: SwallowType, Stream: "upstream", Attributes: map[string]any{"timeout": 600_000}}); err != nil {
				t.Error(err)
			}
			close(partitioned)
		})
	}
	if strings.HasPrefix(when, "slow-") {
		if _, err := proxy.Add(Fault{Type: LatencyType, Stream: "downstream", Attributes: map[string]any{"latency": 40}}); err != nil {
			return err
		}
	}
	hs := &hookStore{Store: sa}
	if strings.HasSuffix(when, "first-extension-lost") {
		hs.beforeExtend = cut
	} else {
		hs.afterExtend = cut
	}
	gA := guard.New(hs, guard.Options{Lease: lease})
	key := guard.Key{Scope: "partition/" + name, ID: fmt.Sprint(i)}

	got := make(chan *context.Context, 1)
	done := make(chan struct{})
	go func() { defer close(done); holder(context.Background(), gA, key, tr, got) }()
	var aCtx *context.Context
	select {
	case aCtx = <-got:
	case <-done:
		return fmt.Errorf("%s: the holder did not run: %v", key, tr.errA)
	}
	<-partitioned
	err = claimant(t, gB, key, aCtx, tr, 10*lease)
	proxy.Close() // the holder's calls fail now, instead of waiting out their timeouts
	select {
	case <-done:
	case <-time.After(2 * lease):
		// A fail, not a hang until the test binary's timeout.
		return fmt.Errorf("%s: the holder's effect still ran %s after the partition was closed: its context did not end at its deadline (claimant: %v)",
			key, 2*lease, err)
	}
	if err != nil {
		return err
	}
	if !errors.Is(tr.errA, guard.ErrLeaseLost) {
		return fmt.Errorf("%s: holder's Do = %v, want its effect's ErrLeaseLost", key, tr.errA)
	}
	return nil
}

// CLIENT PAUSE for twice the lease, while holders run, on a server of the
// test's own; the holders use the README's client (go-redis defaults), so
// their extensions block through the pause and then succeed, too late.
// Every holder's context ends before the other claim succeeds: 0 overlaps.
func TestClientPauseHolderStopsFirst(t *testing.T) {
	const lease, holders = time.Second, 12
	rounds := 2
	if *soak {
		rounds = 10
	}
	srv := testenv.StartRedis(t)
	snapshot := goleak.IgnoreCurrent()
	readme := redis.NewClient(&redis.Options{Addr: srv.Addr()}) // as the README builds it
	defer readme.Close()
	other := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer other.Close()
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer admin.Close()
	prefix := testenv.Prefix(t)
	gB := guard.New(guardenv.StoreOn(t, other, guard.RedisOptions{Prefix: prefix}), guard.Options{Lease: lease})

	var all []trial
	for round := range rounds {
		var extended atomic.Int32
		paused := make(chan struct{})
		var once sync.Once
		hs := &hookStore{Store: guardenv.StoreOn(t, readme, guard.RedisOptions{Prefix: prefix}), afterExtend: func() {
			if extended.Add(1) == holders { // every holder extended once
				once.Do(func() {
					if err := admin.Do(context.Background(), "CLIENT", "PAUSE", (2 * lease).Milliseconds(), "ALL").Err(); err != nil {
						t.Error(err)
					}
					close(paused)
				})
			}
		}}
		gA := guard.New(hs, guard.Options{Lease: lease})
		results := make([]trial, holders)
		var wg sync.WaitGroup
		for i := range holders {
			wg.Go(func() {
				tr := &results[i]
				key := guard.Key{Scope: "pause", ID: fmt.Sprint(round, "-", i)}
				got := make(chan *context.Context, 1)
				done := make(chan struct{})
				go func() { defer close(done); holder(context.Background(), gA, key, tr, got) }()
				aCtx := <-got
				<-paused
				if err := claimant(t, gB, key, aCtx, tr, 10*lease); err != nil {
					t.Error(err)
				}
				<-done
			})
		}
		wg.Wait()
		all = append(all, results...)
	}
	if !t.Failed() {
		report(t, "client-pause", all)
	}
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
}
