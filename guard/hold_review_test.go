package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Keep with a lease whose deadline has passed (a Wait answered late, a
// holder descheduled between Claim and Keep): its context ends at once,
// but it still holds that lease, and its writes end that claim ("the
// writes may still be tried"), not an empty one.
func TestReviewKeepPastDeadlineKeepsLease(t *testing.T) {
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
func TestReviewHoldObserverPanicStopsHeartbeat(t *testing.T) {
	const lease = 300 * time.Millisecond
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
