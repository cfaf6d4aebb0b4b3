package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Hold's claim, run and completion: Acquired with a holder whose context
// lives until Complete, then a replay with no holder.
func TestHoldCompletes(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "s", ID: "held"}
	out, h, err := g.Hold(bg, key, "fp")
	if err != nil || out.Status != guard.Acquired || h == nil {
		t.Fatalf("Hold = %+v, %v, %v; want Acquired with a holder", out, h, err)
	}
	if h.Lease() != out.Lease || h.Lease().Token == "" || h.Lease().Deadline.IsZero() {
		t.Fatalf("holder's lease %+v, want the outcome's %+v", h.Lease(), out.Lease)
	}
	ctx := h.Context()
	if ctx.Err() != nil {
		t.Fatalf("the effect's context ended before the claim did: %v", context.Cause(ctx))
	}
	if err := h.Complete([]byte("v")); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() == nil {
		t.Fatal("the effect's context outlived Complete")
	}
	out, h2, err := g.Hold(bg, key, "fp")
	if err != nil || out.Status != guard.Replay || string(out.Result) != "v" || h2 != nil {
		t.Fatalf("second Hold = %+v, %v, %v; want the replay and no holder", out, h2, err)
	}
	if _, h3, err := g.Hold(bg, key, "other"); !errors.Is(err, guard.ErrMismatch) || h3 != nil {
		t.Fatalf("Hold with another fingerprint = %v, %v; want ErrMismatch and no holder", h3, err)
	}
}

// A claim made through Hold is not cut short by its caller's
// cancellation (the context only bounds the effect), where Claim's is.
func TestHoldClaimOutlivesCaller(t *testing.T) {
	g := realGuard(t, guard.Options{})
	gone, cancel := context.WithCancel(bg)
	cancel()
	if _, err := g.Claim(gone, guard.Key{Scope: "s", ID: "claim-gone"}, "fp"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Claim with a cancelled context = %v, want context.Canceled", err)
	}
	key := guard.Key{Scope: "s", ID: "hold-gone"}
	out, h, err := g.Hold(gone, key, "fp")
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("Hold with a cancelled context = %+v, %v; want Acquired", out, err)
	}
	if !errors.Is(h.Context().Err(), context.Canceled) {
		t.Fatalf("the effect's context = %v, want its parent's cancellation", h.Context().Err())
	}
	if err := h.Release(); err != nil { // the write outlives the caller too
		t.Fatal(err)
	}
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("after Release: %v, want ErrNotFound", err)
	}
}

// The holder's heartbeat keeps the key for longer than a lease, and Fail
// ends the claim: the key runs again, as a second attempt.
func TestHoldKeepsLeaseThenFails(t *testing.T) {
	t.Parallel()
	// Each heartbeat (one a third of a lease) and the second Hold's claim
	// must be answered within a lease on a real server: 600ms was within
	// a stall of a loaded machine.
	const lease = 1500 * time.Millisecond
	g := realGuard(t, guard.Options{Lease: lease})
	key := guard.Key{Scope: "s", ID: "held-long"}
	_, h, err := g.Hold(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Context().Done():
		t.Fatalf("lease lost while heartbeating: %v", context.Cause(h.Context()))
	case <-time.After(3 * lease): // three leases pass; only heartbeats keep the key
	}
	if _, _, err := g.Hold(bg, key, "fp"); !errors.Is(err, guard.ErrInProgress) {
		t.Fatalf("second Hold while the first holds = %v, want ErrInProgress", err)
	}
	if err := h.Fail(errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	out, h2, err := g.Hold(bg, key, "fp")
	if err != nil || out.Lease.Attempt != 2 {
		t.Fatalf("Hold after Fail = %+v, %v; want attempt 2", out, err)
	}
	if err := h2.Complete([]byte("v")); err != nil {
		t.Fatal(err)
	}
}

// Keep holds what Claim acquired; a write may follow Stop (a retry after
// an error), and a Stop after the write changes nothing.
func TestKeepThenWriteAfterStop(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "s", ID: "kept"}
	out, err := g.Claim(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	h := g.Keep(bg, out.Lease)
	if h.Lease() != out.Lease || h.Context().Err() != nil {
		t.Fatalf("Keep: lease %+v, context %v", h.Lease(), h.Context().Err())
	}
	h.Stop()
	if h.Context().Err() == nil {
		t.Fatal("Stop left the effect's context running")
	}
	if err := h.Complete([]byte("v")); err != nil {
		t.Fatalf("Complete after Stop = %v", err)
	}
	h.Stop()
	if rec, err := g.Get(bg, key); err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("record %+v, %v; want completed", rec, err)
	}
}

// A holder whose lease another holder recovered: its context ends with
// ErrLeaseLost, and its completion is refused.
func TestHoldLeaseLost(t *testing.T) {
	s, mr := miniStore(t)
	const lease = 400 * time.Millisecond
	g := guard.New(s, guard.Options{Lease: lease})
	key := guard.Key{Scope: "s", ID: "held-stolen"}
	_, h, err := g.Hold(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	mr.FastForward(lease + time.Millisecond)
	if other, err := g.Claim(bg, key, "fp"); err != nil || !other.Lease.Recovered {
		t.Fatalf("recovery = %+v, %v", other, err)
	}
	<-h.Context().Done()
	if cause := context.Cause(h.Context()); !errors.Is(cause, guard.ErrLeaseLost) {
		t.Fatalf("cause = %v, want ErrLeaseLost", cause)
	}
	if err := h.Complete([]byte("late")); !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("late Complete = %v, want ErrLeaseLost", err)
	}
}

// firstWriteFails is a real store whose first Complete fails as if the
// connection dropped; the second checks that the first one's context,
// which the retry's must not be, stayed ended.
type firstWriteFails struct {
	guard.Store
	t     *testing.T
	first context.Context
	done  <-chan struct{}
}

func (s *firstWriteFails) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	if s.first == nil {
		s.first, s.done = ctx, ctx.Done()
		return fmt.Errorf("%w: connection reset", guard.ErrUnavailable)
	}
	select {
	case <-s.done:
	default:
		s.t.Error("the failed write's context did not end with it")
	}
	if s.first.Err() == nil {
		s.t.Error("the failed write's context: Done is closed, but Err is nil again once the retry runs")
	}
	if ctx == s.first {
		s.t.Error("the retry runs on the failed write's context")
	}
	return s.Store.Complete(ctx, lease, result, ttl)
}

// A write tried again after an error (Complete is retried by httpx and
// grpcx while the store is unreachable) runs on a context of its own: the
// failed write's, which contexts derived from it may still read, stays
// ended.
func TestHoldCompleteRetry(t *testing.T) {
	s := &firstWriteFails{Store: realStore(t), t: t}
	g := guard.New(s, guard.Options{})
	key := guard.Key{Scope: "s", ID: "held-retry"}
	_, h, err := g.Hold(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Complete([]byte("v")); !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("first Complete = %v, want ErrUnavailable", err)
	}
	if err := h.Complete([]byte("v")); err != nil {
		t.Fatalf("retried Complete = %v", err)
	}
	if rec, err := g.Get(bg, key); err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("record %+v, %v; want completed", rec, err)
	}
}

// Keep with a lease whose deadline has passed (a Wait answered late, a
// holder descheduled between Claim and Keep): its context ends at once,
// but it still holds that lease, and its writes end that claim ("the
// writes may still be tried"), not an empty one.
func TestKeepPastDeadlineKeepsLease(t *testing.T) {
	g := realGuard(t, guard.Options{})
	key := guard.Key{Scope: "s", ID: "kept-late"}
	out, err := g.Claim(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	late := out.Lease
	late.Deadline = time.Now().Add(-time.Millisecond) // as if Keep came after it
	h := g.Keep(bg, late)
	if cause := context.Cause(h.Context()); !errors.Is(cause, guard.ErrLeaseLost) {
		t.Fatalf("Keep past the deadline: context cause %v, want ErrLeaseLost", cause)
	}
	if got := h.Lease(); got.Key != key || got.Token != out.Lease.Token {
		t.Fatalf("Keep past the deadline holds lease %+v, want %+v", got, late)
	}
	if err := h.Release(); err != nil {
		t.Fatalf("Release of the late lease = %v", err)
	}
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("after Release: %v, want ErrNotFound (the key left claimed)", err)
	}
}

// An Observer that panics on the Acquired event (a metrics call with the
// wrong labels panics) unwinds Hold after the heartbeat started: nobody
// holds the claim, so its lease must run out as an abandoned one's does,
// not be extended for as long as the process lives.
func TestHoldObserverPanicStopsHeartbeat(t *testing.T) {
	// Long enough for Hold's claim to be answered before the guard's
	// deadline on a loaded machine (a claim refused as late never reaches
	// the observer); the wait for the lease's end polls.
	const lease = time.Second
	s := realStore(t)
	panicky := guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		if e.Kind == guard.EventAcquired {
			panic("observer")
		}
	})
	g := guard.New(s, guard.Options{Lease: lease, Observer: panicky})
	key := guard.Key{Scope: "s", ID: "held-observer-panic"}
	func() {
		defer func() {
			if p := recover(); p != "observer" {
				t.Fatalf("recovered %v, want the observer's panic", p)
			}
		}()
		_, _, _ = g.Hold(bg, key, "fp")
	}()
	other := guard.New(s, guard.Options{Lease: lease})
	testenv.WaitFor(t, 20*lease, "the abandoned claim's lease to run out", func() bool {
		out, err := other.Claim(bg, key, "fp")
		if err != nil {
			return false
		}
		_ = other.Release(bg, out.Lease)
		return true
	})
}

// HoldWith's call options are in force for its claim: with MaxAttempts
// 1, a key whose first attempt failed is exhausted for this caller,
// while the guard's own limit (none here) lets Hold take it again.
func TestHoldWithCallOptions(t *testing.T) {
	g := realGuard(t, guard.Options{MaxAttempts: -1})
	key := guard.Key{Scope: "s", ID: "held-with"}
	_, h, err := g.Hold(bg, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Fail(errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	var ex *guard.ExhaustedError
	if _, h2, err := g.HoldWith(bg, key, "fp", guard.CallOptions{MaxAttempts: 1}); !errors.As(err, &ex) || h2 != nil {
		t.Fatalf("HoldWith(MaxAttempts 1) after a failure: holder %t, %v; want ErrExhausted and no holder", h2 != nil, err)
	}
	out, h3, err := g.Hold(bg, key, "fp")
	if err != nil || out.Lease.Attempt != 2 {
		t.Fatalf("Hold after the failure = %+v, %v; want attempt 2", out, err)
	}
	if err := h3.Complete([]byte("v")); err != nil {
		t.Fatal(err)
	}
}

// Held's methods may be called from several goroutines at once (run with
// -race): readers of its lease and context beside two Completes. The
// first to finish ends the claim (and may cut the other off, as the doc
// says); the key ends completed and the context ended.
func TestHeldConcurrentUse(t *testing.T) {
	g := realGuard(t, guard.Options{})
	for i := range 50 {
		key := guard.Key{Scope: "s", ID: fmt.Sprint("held-concurrent-", i)}
		_, h, err := g.Hold(bg, key, "fp")
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for j := range errs {
			wg.Go(func() { errs[j] = h.Complete([]byte("v")) })
		}
		wg.Go(func() { _ = h.Lease().Fence; _ = h.Context().Err() })
		wg.Wait()
		h.Stop() // after the writes: changes nothing
		if h.Context().Err() == nil {
			t.Fatal("the context outlived the Completes")
		}
		if errs[0] != nil && errs[1] != nil {
			t.Fatalf("both Completes failed: %v; %v", errs[0], errs[1])
		}
		if rec, err := g.Get(bg, key); err != nil || rec.State != guard.StateCompleted {
			t.Fatalf("record %+v, %v; want completed", rec, err)
		}
	}
}
