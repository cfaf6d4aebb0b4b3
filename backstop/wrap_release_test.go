package backstop_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapReleaseIsAsIfNeverClaimed: a first attempt released (rejected
// before any effect: a 5xx released by httpx, a lock not obtained, a
// consumer shutting down) leaves the key as if it had never been
// claimed, so the next request under the key runs whatever its payload,
// as it does on the Redis store alone. The wrapped store must not refuse
// it as a mismatch because of the released holder's mark.
func TestWrapReleaseIsAsIfNeverClaimed(t *testing.T) {
	t.Parallel()
	b := mustBackstop(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
	for _, tc := range []struct {
		name  string
		store guard.Store
	}{
		{"redis", guardenv.Store(t, guard.RedisOptions{})},
		{"wrapped", backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, key := tc.store, newKey(t)
			req := func(tok, fp string) guard.ClaimRequest {
				return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: 10 * time.Second, TTL: time.Hour, MaxAttempts: 3}
			}
			out, err := s.Claim(ctx, req("A", "fp-a"))
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("first claim = %+v, %v", out, err)
			}
			if err := s.Release(ctx, out.Lease); err != nil {
				t.Fatalf("release: %v", err)
			}
			out, err = s.Claim(ctx, req("B", "fp-b"))
			if err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 1 {
				t.Fatalf("claim with another payload after the release = %s %+v, %v; want a first attempt acquired", out.Status, out.Lease, err)
			}
		})
	}
}
