package backstop_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestStepRefusedAfterLaterHolderCompleted: a holder whose lease was
// taken over is refused a step (ErrStaleFence) once the later holder
// completed the key, as it is while the later holder runs. The fence
// check read only rows not yet completed, so after the completion (the
// later holder's Store record, or its Backstop.Commit row) the stale
// holder's step, and its effect, committed; so did an unguarded attempt's
// (fallback's FailOpen) once the key's effect was committed.
func TestStepRefusedAfterLaterHolderCompleted(t *testing.T) {
	t.Parallel()
	t.Run("pgstore record completed", func(t *testing.T) {
		t.Parallel()
		db := pgenv.Migrated(t, pgstore.Options{})
		reservationsTable(t, db)
		b := mustBackstop(t, db, pgstore.Options{})
		s := pgenv.Store(t, db, pgstore.Options{})
		key := newKey(t)
		old, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "OLD", Fingerprint: "fp", Lease: 50 * time.Millisecond, TTL: time.Hour})
		if err != nil || old.Status != guard.Acquired {
			t.Fatal(old, err)
		}
		testenv.WaitFor(t, 10*time.Second, "OLD's lease to run out", func() bool {
			rec, err := s.Get(ctx, key)
			return err == nil && rec.LeaseLeft == 0
		})
		nb, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "NEW", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || nb.Status != guard.Acquired || nb.Lease.Fence <= old.Lease.Fence {
			t.Fatal(nb, err)
		}
		if err := s.Complete(ctx, nb.Lease, []byte("done by NEW"), time.Hour); err != nil {
			t.Fatal(err)
		}
		var ran atomic.Int64
		if err := tryReserve(t, db, b, old.Lease, &ran); !errors.Is(err, backstop.ErrStaleFence) {
			t.Fatalf("the stale holder's CommitStep after NEW (fence %d) completed the key = %v, want ErrStaleFence; %d reservations",
				nb.Lease.Fence, err, reservations(t, db, key))
		}
	})
	for _, c := range []struct {
		name string
		late guard.Lease
	}{
		{"backstop row committed", guard.Lease{Token: "OLD", Fence: 1, Attempt: 1}},
		{"unguarded after the commit", guard.Lease{Token: "FAILOPEN", Fence: 0, Attempt: 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := pgenv.Migrated(t, pgstore.Options{})
			reservationsTable(t, db)
			pgenv.PaymentsTable(t, db)
			b := mustBackstop(t, db, pgstore.Options{})
			key := newKey(t)
			if err := pay(t, db, b, guard.Lease{Key: key, Token: "NEW", Fence: 2, Attempt: 2}, "paid by NEW"); err != nil {
				t.Fatal(err)
			}
			late := c.late
			late.Key = key
			var ran atomic.Int64
			if err := tryReserve(t, db, b, late, &ran); !errors.Is(err, backstop.ErrStaleFence) {
				t.Fatalf("a fence-%d CommitStep after fence 2 committed the key = %v, want ErrStaleFence; %d reservations",
					late.Fence, err, reservations(t, db, key))
			}
			if n := reservations(t, db, key); n != 0 {
				t.Errorf("%d reservations committed after the key's effect was, want 0", n)
			}
		})
	}
}
