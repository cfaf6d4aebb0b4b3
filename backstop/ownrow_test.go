package backstop_test

import (
	"database/sql"

	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestStepAfterOwnCommitInSameTx: a holder whose Commit wrote the
// key's row earlier in the same transaction may still commit a step in
// it: its own completed row is no later holder's ("The holder's own
// completed row refuses nothing, as before", 0e24212). That holds for an
// unguarded lease (fallback's FailOpen, fence 0) too, whose Commit writes
// its row with fence 1 and its own token: CommitStep compared that row's
// fence with the lease's 0 and refused it (ErrStaleFence).
func TestStepAfterOwnCommitInSameTx(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		lease guard.Lease
	}{
		{"guarded", guard.Lease{Token: "HOLDER", Fence: 1, Attempt: 1}},
		{"unguarded", guard.Lease{Token: "FAILOPEN", Fence: 0, Attempt: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := pgenv.Migrated(t, pgstore.Options{})
			pgenv.PaymentsTable(t, db)
			b := mustBackstop(t, db, pgstore.Options{})
			l := c.lease
			l.Key = newKey(t)
			err := payWith(t, db, l, func(tx_ *sql.Tx) error {
				if err := b.Commit(ctx, tx_, l, "fp", []byte("paid")); err != nil {
					t.Fatalf("Commit: %v", err)
				}
				return b.CommitStep(ctx, tx_, l, "receipt", []byte("sent"))
			})
			if err != nil {
				t.Errorf("fence-%d CommitStep after its own Commit in the same transaction: %v, want nil", l.Fence, err)
			}
		})
	}
}
