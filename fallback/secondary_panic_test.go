package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// panickyGets is a store whose Get panics for key ID "boom".
type panickyGets struct{ guard.Store }

func (p panickyGets) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	if key.ID == "boom" {
		panic("secondary bug")
	}
	return p.Store.Get(ctx, key)
}

// TestSecondaryPanicNotCountedAgainstPrimary: the primary answers a
// claim Acquired (a success the breaker was told of), then the switch-back
// check's read of the secondary panics. The panic is the secondary's: it
// reaches the caller, and the breaker hears nothing more of the primary's
// call. (reportPanic called the breaker's done a second time, a failure,
// which opened the breaker over a healthy primary.)
func TestSecondaryPanicNotCountedAgainstPrimary(t *testing.T) {
	p := newPrimary(t)
	sec, _ := pgStore(t)
	s := newStore(t, p.store, fallback.Options{Policy: fallback.Secondary, Secondary: panickyGets{sec},
		FailuresToOpen: 1, OpenTimeout: time.Hour, Logger: quiet})
	func() {
		defer func() {
			if r := recover(); r != "secondary bug" {
				t.Fatalf("recovered %v, want the secondary's panic", r)
			}
		}()
		_, _ = s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "boom"}, Token: "T", Fingerprint: "fp",
			Lease: time.Minute, TTL: time.Hour})
		t.Fatal("Claim returned after the secondary panicked")
	}()
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("breaker %v after the secondary panicked on a claim the primary answered; want closed", st)
	}
}
