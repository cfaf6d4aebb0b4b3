package pgstore_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// TestClaimAgainKeepsExtendedLease: the same claim sent again (a retry
// after a lost reply) gets the same answer and leaves the lease as it is,
// as claim.lua and memstore do. The Store renewed it to one Lease from
// now, which shortened a lease its holder had extended: another claimant
// could then recover the key while the holder, within the deadline it
// counted, still ran.
func TestClaimAgainKeepsExtendedLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		store guard.Store
	}{
		{"memstore", memstore.New(memstore.Options{})},
		{"pgstore", pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.store
			req := guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "again"}, Token: "A", Fingerprint: "fp", Lease: 2 * time.Second, TTL: time.Hour}
			first, err := s.Claim(ctx, req)
			if err != nil || first.Status != guard.Acquired {
				t.Fatalf("claim = %s, %v", first.Status, err)
			}
			if err := s.Extend(ctx, first.Lease, time.Hour); err != nil {
				t.Fatalf("extend: %v", err)
			}
			again, err := s.Claim(ctx, req)
			if err != nil || again.Status != guard.Acquired || again.Lease.Fence != first.Lease.Fence || again.Lease.Attempt != first.Lease.Attempt {
				t.Fatalf("the same claim again = %s fence %d attempt %d, %v; want the first answer", again.Status, again.Lease.Fence, again.Lease.Attempt, err)
			}
			rec, err := s.Get(ctx, req.Key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.LeaseLeft < 30*time.Minute {
				t.Fatalf("lease left after the same claim again: %s; want the extended hour", rec.LeaseLeft)
			}
		})
	}
}
