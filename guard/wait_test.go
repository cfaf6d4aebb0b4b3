package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// waitResult is what a Wait started in the background answered.
type waitResult struct {
	out guard.Outcome
	err error
	at  time.Time
}

func waitAsync(ctx context.Context, g *guard.Guard, key guard.Key, fp string, opts guard.WaitOptions) <-chan waitResult {
	ch := make(chan waitResult, 1)
	go func() {
		out, err := g.Wait(ctx, key, fp, opts)
		ch <- waitResult{out, err, time.Now()}
	}()
	return ch
}

// holdKey claims key for a holder that does not finish until told.
func holdKey(t *testing.T, g *guard.Guard, key guard.Key) guard.Lease {
	t.Helper()
	out, err := g.Claim(bg, key, "fp")
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("holder's claim: %v, %+v", err, out)
	}
	return out.Lease
}

// notYet fails if ch has answered: the waiter must still be waiting.
func notYet(t *testing.T, ch <-chan waitResult) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("Wait returned while the key was held: %+v, %v", r.out, r.err)
	case <-time.After(50 * time.Millisecond):
	}
}

// A duplicate gets the first holder's result once it is stored, well
// before its timeout, and a duplicate with another fingerprint gets
// ErrMismatch.
func TestWaitReplaysFirstResult(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{})
	key := guard.Key{Scope: "wait", ID: "replay"}
	lease := holdKey(t, g, key)
	same := waitAsync(bg, g, key, "fp", guard.WaitOptions{Timeout: time.Minute})
	other := waitAsync(bg, g, key, "other", guard.WaitOptions{Timeout: time.Minute})
	notYet(t, same)
	if err := g.Complete(bg, lease, []byte("first")); err != nil {
		t.Fatal(err)
	}
	stored := time.Now()
	r := <-same
	if r.err != nil || r.out.Status != guard.Replay || string(r.out.Result) != "first" {
		t.Fatalf("same fingerprint: %v, %+v", r.err, r.out)
	}
	// Polls are at most 100 ms apart; 10 s is for a loaded machine, and
	// far from the minute Wait was allowed.
	if d := r.at.Sub(stored); d > 10*time.Second {
		t.Fatalf("replay came %s after the result was stored", d)
	}
	if r := <-other; !errors.Is(r.err, guard.ErrMismatch) {
		t.Fatalf("other fingerprint: %v, %+v", r.err, r.out)
	}
}

// A holder that releases the key, fails it, or lets its lease run out
// hands it to the waiter (Acquired); a failure past the waiter's
// MaxAttempts is ErrExhausted.
func TestWaitClaimsFreedKey(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{Lease: 2 * time.Second})
	opts := guard.WaitOptions{Timeout: time.Minute}

	released := guard.Key{Scope: "wait", ID: "released"}
	lease := holdKey(t, g, released)
	ch := waitAsync(bg, g, released, "fp", opts)
	notYet(t, ch)
	if err := g.Release(bg, lease); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r.err != nil || r.out.Status != guard.Acquired || r.out.Lease.Attempt != 1 {
		t.Fatalf("after a release: %v, %+v", r.err, r.out)
	} else if err := g.Complete(bg, r.out.Lease, []byte("waiter")); err != nil {
		t.Fatal(err)
	}

	// A failure: a waiter whose limit is 1 is told ErrExhausted; one with
	// the guard's (none) takes the key for attempt 2.
	failed := guard.Key{Scope: "wait", ID: "failed"}
	lease = holdKey(t, g, failed)
	limited := waitAsync(bg, g, failed, "fp", guard.WaitOptions{Timeout: time.Minute, CallOptions: guard.CallOptions{MaxAttempts: 1}})
	notYet(t, limited)
	if err := g.Fail(bg, lease, errBoom); err != nil {
		t.Fatal(err)
	}
	if r := <-limited; !errors.Is(r.err, guard.ErrExhausted) {
		t.Fatalf("after a failure, limit 1: %v, %+v", r.err, r.out)
	}
	lease = holdKey(t, g, failed) // attempt 2
	ch = waitAsync(bg, g, failed, "fp", opts)
	notYet(t, ch)
	if err := g.Fail(bg, lease, errBoom); err != nil {
		t.Fatal(err)
	}
	if r := <-ch; r.err != nil || r.out.Status != guard.Acquired || r.out.Lease.Attempt != 3 {
		t.Fatalf("after a failure, no limit: %v, %+v", r.err, r.out)
	} else if err := g.Complete(bg, r.out.Lease, nil); err != nil {
		t.Fatal(err)
	}

	// The holder dies: its lease runs out and the waiter recovers the key.
	abandoned := guard.Key{Scope: "wait", ID: "abandoned"}
	holdKey(t, g, abandoned)
	r := <-waitAsync(bg, g, abandoned, "fp", opts)
	if r.err != nil || r.out.Status != guard.Acquired || !r.out.Lease.Recovered {
		t.Fatalf("after the holder's lease ran out: %v, %+v", r.err, r.out)
	}
	if err := g.Release(bg, r.out.Lease); err != nil {
		t.Fatal(err)
	}
}

// Many duplicates wait on one key whose holder releases it: exactly one
// of them runs the effect, and every other gets its result.
func TestWaitManyDuplicatesOneEffect(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{})
	key := guard.Key{Scope: "wait", ID: "storm"}
	lease := holdKey(t, g, key)
	const waiters = 16
	var (
		effects atomic.Int32
		wg      sync.WaitGroup
		mu      sync.Mutex
		replays = map[string]int{}
		errs    []error
	)
	for i := range waiters {
		wg.Go(func() {
			out, err := g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: time.Minute})
			switch {
			case err != nil:
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			case out.Status == guard.Acquired:
				effects.Add(1)
				if err := g.Complete(bg, out.Lease, fmt.Appendf(nil, "waiter %d", i)); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			case out.Status == guard.Replay:
				mu.Lock()
				replays[string(out.Result)]++
				mu.Unlock()
			}
		})
	}
	if err := g.Release(bg, lease); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if n := effects.Load(); n != 1 {
		t.Fatalf("%d waiters ran the effect, want 1", n)
	}
	if len(replays) != 1 {
		t.Fatalf("replays: %v, want one result for %d waiters", replays, waiters-1)
	}
	for _, n := range replays {
		if n != waiters-1 {
			t.Fatalf("replays: %v, want %d", replays, waiters-1)
		}
	}
}

// When the timeout passes first, Wait returns *InProgressError with what
// was left of the holder's lease; zero Timeout waits up to the guard's
// Lease. Nothing is claimed.
func TestWaitTimeout(t *testing.T) {
	// The holder's heartbeats (one a third of a lease) must be answered
	// within a lease on a loaded machine, or Wait gets the key: 400ms was
	// within a stall.
	const leaseD = 1200 * time.Millisecond
	g := guard.New(realStore(t), guard.Options{Lease: leaseD})
	key := guard.Key{Scope: "wait", ID: "timeout"}
	lease := holdKey(t, g, key)
	_, stop := g.KeepAlive(bg, lease)
	defer stop()
	for _, tc := range []struct {
		timeout, want time.Duration
	}{{150 * time.Millisecond, 150 * time.Millisecond}, {0, leaseD}} {
		start := time.Now()
		out, err := g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: tc.timeout})
		took := time.Since(start)
		ip, ok := errors.AsType[*guard.InProgressError](err)
		if !ok || out.Status != 0 {
			t.Fatalf("timeout %s: %v, %+v, want *InProgressError", tc.timeout, err, out)
		}
		if ip.RetryAfter <= 0 || ip.RetryAfter > leaseD {
			t.Fatalf("timeout %s: RetryAfter %s, want the holder's lease left", tc.timeout, ip.RetryAfter)
		}
		if took < tc.want || took > tc.want+10*time.Second {
			t.Fatalf("timeout %s: returned after %s", tc.timeout, took)
		}
	}
	rec, err := g.Get(bg, key)
	if err != nil || rec.State != guard.StatePending || rec.Fence != lease.Fence {
		t.Fatalf("the holder's record changed: %v, %+v", err, rec)
	}
}

// When ctx ends first, Wait returns an error matching ctx's (and its
// cause), and claims nothing: the key freed afterwards stays free.
func TestWaitContextEnds(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{})
	key := guard.Key{Scope: "wait", ID: "gone"}
	lease := holdKey(t, g, key)

	ctx, cancel := context.WithCancel(bg)
	ch := waitAsync(ctx, g, key, "fp", guard.WaitOptions{Timeout: time.Minute})
	notYet(t, ch)
	cancel()
	if r := <-ch; !errors.Is(r.err, context.Canceled) || r.out.Status != 0 {
		t.Fatalf("cancelled: %v, %+v", r.err, r.out)
	}

	errLeft := errors.New("client left")
	cctx, ccancel := context.WithCancelCause(bg)
	ch = waitAsync(cctx, g, key, "fp", guard.WaitOptions{Timeout: time.Minute})
	notYet(t, ch)
	ccancel(errLeft)
	if r := <-ch; !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, errLeft) {
		t.Fatalf("cancelled with a cause: %v", r.err)
	}

	dctx, dcancel := context.WithTimeout(bg, 100*time.Millisecond)
	defer dcancel()
	if _, err := g.Wait(dctx, key, "fp", guard.WaitOptions{Timeout: time.Minute}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}

	if err := g.Release(bg, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("after the waiters left and the holder released: %v, want ErrNotFound", err)
	}
	if _, err := g.Wait(bg, guard.Key{Scope: "wait"}, "fp", guard.WaitOptions{}); !errors.Is(err, guard.ErrInvalidKey) {
		t.Fatalf("empty id: %v", err)
	}
}

// Wait's Timeout bounds its reads of the record too: a server that stops
// answering while the key is held (here paused with CLIENT PAUSE) does
// not keep Wait past its Timeout, on a client that ends its calls by
// their context's deadline.
func TestWaitTimeoutBoundsReads(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	g := guard.New(guardenv.StoreOn(t, c, guard.RedisOptions{}), guard.Options{})
	key := guard.Key{Scope: "wait", ID: "paused"}
	holdKey(t, g, key)
	if err := srv.Client().Do(bg, "client", "pause", 10000, "all").Err(); err != nil {
		t.Fatal(err)
	}
	const timeout = 300 * time.Millisecond
	start := time.Now()
	_, err := g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: timeout})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Wait with a Timeout of %s returned after %s: its read waited for a server that did not answer", timeout, d)
	}
	if _, busy := errors.AsType[*guard.InProgressError](err); !busy {
		t.Errorf("Wait: %v, want *InProgressError", err)
	}
}

// callCounter is a real store that counts the reads and claims made of it.
type callCounter struct {
	guard.Store
	gets, claims atomic.Int64
}

func (c *callCounter) Get(ctx context.Context, k guard.Key) (guard.Record, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, k)
}

func (c *callCounter) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, req)
}

// A long wait does not spin: while the key is held, Wait only reads the
// record, backing off to one read per 100 ms (with up to a fifth of
// jitter), and sends no claim; the result stored then is its answer, by
// one claim.
func TestWaitLongWaitReadsSparingly(t *testing.T) {
	s := &callCounter{Store: realStore(t)}
	g := guard.New(s, guard.Options{})
	key := guard.Key{Scope: "wait", ID: "sparing"}
	lease := holdKey(t, g, key)
	s.claims.Store(0)
	const held = 1500 * time.Millisecond
	ch := waitAsync(bg, g, key, "fp", guard.WaitOptions{Timeout: time.Minute})
	time.Sleep(held) // the holder's effect runs: what is measured is Wait's calls meanwhile
	gets, claims := s.gets.Load(), s.claims.Load()
	if err := g.Complete(bg, lease, []byte("done")); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil || r.out.Status != guard.Replay || string(r.out.Result) != "done" {
		t.Fatalf("Wait = %+v, %v; want the replay", r.out, r.err)
	}
	// 10, 20, 40, 80 ms, then every 100 ms: about 17 reads in 1.5 s.
	if gets < 5 || gets > 20 || claims != 0 {
		t.Fatalf("%d reads and %d claims while the key was held %s, want 5 to 20 reads and no claim", gets, claims, held)
	}
	if n := s.claims.Load(); n != 1 {
		t.Fatalf("%d claims in all, want the one that replayed", n)
	}
}
