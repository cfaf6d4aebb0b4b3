package fallback_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// TestLateClaimReleased: Redis stalls (CLIENT PAUSE WRITE) past the
// fallback's Timeout while a claim is on its way; the caller is answered
// ErrUnavailable at the bound, and Redis takes the claim once the pause
// ends. Nobody holds that lease: it must be given back, as guard gives
// back a claim answered after its lease's deadline, not left pending
// for the whole lease (every retry told the key is in progress, then an
// attempt counted for an effect that never ran).
func TestLateClaimReleased(t *testing.T) {
	t.Parallel()
	p := newPrimary(t)
	s := newStore(t, p.store, fallback.Options{Timeout: 200 * time.Millisecond, FailuresToOpen: 100, Logger: quiet})
	admin := p.srv.Client()
	key := guard.Key{Scope: "late", ID: t.Name()}
	req := guard.ClaimRequest{Key: key, Token: "LATE", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}

	if err := admin.Do(bg, "CLIENT", "PAUSE", "10000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(bg, req); !isUnavailable(err) {
		t.Fatalf("claim during the stall = %v, want ErrUnavailable", err)
	}
	// The stall ends; Redis runs the late claim. A retry must have the
	// key well within the late claim's lease, as a first attempt.
	if err := admin.Do(bg, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	next := guard.ClaimRequest{Key: key, Token: "NEXT", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	var out guard.Outcome
	waitFor(t, 5*time.Second, "a retry acquiring the key", func() bool {
		var err error
		out, err = s.Claim(bg, next)
		if isUnavailable(err) && !errors.Is(err, fallback.ErrBreakerOpen) {
			// This retry too was not answered within the Timeout (a
			// loaded machine): try again. Were it taken late, it is
			// given back as the late claim is.
			return false
		}
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		return out.Status == guard.Acquired
	})
	if out.Lease.Attempt != 1 {
		t.Fatalf("retry = %+v; want a first attempt", out)
	}
}
