package guard_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// TestWaitAnswersMismatchOfAnotherPayload: design.md, rule 3 ("Mismatch first. A
// different fingerprint under the same key is refused before anything else
// about the record is revealed to the caller"), and Wait's doc ("returns
// ... ErrMismatch ... as Claim would"). A duplicate B (fingerprint fp) whose
// claim was answered in progress waits; meanwhile the holder releases its
// first attempt (a 5xx) and another request C, same key, another payload,
// takes the key. A claim by B now answers ErrMismatch at once, and so must
// Wait: it waited out its whole Timeout on C's live lease and answered
// *InProgressError (httpx: 409 + Retry-After of C's lease, not 422). C's
// payload may be the empty fingerprint, which is compared like any other.
func TestWaitAnswersMismatchOfAnotherPayload(t *testing.T) {
	stores := map[string]guard.Store{"redis": realStore(t), "memstore": memstore.New(memstore.Options{})}
	for _, c := range []struct{ store, other string }{{"redis", "other"}, {"memstore", "other"}, {"redis", ""}, {"memstore", ""}} {
		name, other := c.store, c.other
		t.Run(fmt.Sprintf("%s/other=%q", name, other), func(t *testing.T) {
			g := guard.New(stores[name], guard.Options{})
			key := guard.Key{Scope: "wait-mismatch", ID: "mismatch-" + name + other + time.Now().Format("150405.000000")}
			a, err := g.Claim(bg, key, "fp")
			if err != nil || a.Status != guard.Acquired {
				t.Fatalf("A's claim: %v %+v", err, a)
			}
			if _, err := g.Claim(bg, key, "fp"); !errors.As(err, new(*guard.InProgressError)) {
				t.Fatalf("B's claim: %v, want in progress", err)
			}
			if err := g.Release(bg, a.Lease); err != nil { // A answered 5xx
				t.Fatal(err)
			}
			c, err := g.Claim(bg, key, other) // "": a fingerprint like any other
			if err != nil || c.Status != guard.Acquired {
				t.Fatalf("C's claim: %v %+v", err, c)
			}
			defer g.Release(bg, c.Lease)
			// What B's claim would answer now:
			if _, err := g.Claim(bg, key, "fp"); !errors.Is(err, guard.ErrMismatch) {
				t.Fatalf("B's claim now: %v, want ErrMismatch", err)
			}
			start := time.Now()
			_, err = g.Wait(bg, key, "fp", guard.WaitOptions{Timeout: 2 * time.Second})
			took := time.Since(start)
			if !errors.Is(err, guard.ErrMismatch) {
				var ip *guard.InProgressError
				if errors.As(err, &ip) {
					t.Errorf("Wait after %v: in progress (RetryAfter %v, the other payload's lease); want ErrMismatch, as Claim answers", took.Round(time.Millisecond), ip.RetryAfter)
				} else {
					t.Errorf("Wait after %v: %v; want ErrMismatch", took.Round(time.Millisecond), err)
				}
			}
		})
	}
}
