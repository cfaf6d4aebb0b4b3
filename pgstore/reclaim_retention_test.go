package pgstore_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
)

// TestClaimAgainKeepsRetention: the same claim sent again after its
// holder extended the lease far beyond the claim's lease and retention
// leaves the record kept for the retention after the extended lease's
// end (claimNew and retake keep a record for lease + TTL, an extension
// moves that end), never shorter than the lease itself: a record that
// expired under a live lease would read as absent, and another claim
// would take the key afresh while its holder, within the deadline it
// was given, still ran: two holders at once. (a mutation review:
// pgstore's reclaim that set expires_at to the claim's lease + TTL from
// now, without GREATEST, passed every test; TestClaimAgainKeepsExtendedLease
// checks the lease, with a retention longer than the extension.)
func TestClaimAgainKeepsRetention(t *testing.T) {
	t.Parallel()
	for name, s := range retentionStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			key := guard.Key{Scope: "retention", ID: "again-retention"}
			req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: 100 * time.Millisecond, TTL: 100 * time.Millisecond}
			first := retentionClaim(t, s, req)
			if err := s.Extend(ctx, first, time.Hour); err != nil {
				t.Fatalf("extend: %v", err)
			}
			if again := retentionClaim(t, s, req); again != first {
				t.Fatalf("the same claim again = %+v, want %+v", again, first)
			}
			rec, err := s.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.LeaseLeft < 30*time.Minute || rec.TTL < rec.LeaseLeft {
				t.Fatalf("record after the same claim again: lease left %s, kept %s; want the extended hour, kept at least as long",
					rec.LeaseLeft, rec.TTL)
			}
			storetest.Wait(t, req.Lease+req.TTL) // the claim's own lease and retention pass; the extended lease does not
			b := req
			b.Token = "B"
			if out, err := s.Claim(ctx, b); err != nil || out.Status != guard.InProgress {
				t.Fatalf("claim by B while A's extended lease runs = %+v, %v; want in progress", out, err)
			}
		})
	}
}
