package backstop_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestCommitHoldsRowUntilTxEnds pins what Commit's documentation says:
// the key's row stays locked by the business transaction, so under Wrap
// the holder's lease extensions (which write that row) cannot pass, and a
// transaction that goes on working after Commit past the lease has its
// run ended by the guard: it rolls back, nothing is committed, no
// payment. A step's transaction, which locks no row of the key, is kept
// alive past its lease.
func TestCommitHoldsRowUntilTxEnds(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	g := guard.New(backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b), guard.Options{Lease: time.Second})
	for _, step := range []bool{false, true} {
		key := newKey(t)
		_, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			defer func() { _ = tx.Rollback() }()
			if step {
				err = b.CommitStep(ctx, tx, l, "pay", []byte("paid"))
			} else {
				err = b.Commit(ctx, tx, l, "fp", []byte("paid"))
			}
			if err != nil {
				return nil, err
			}
			select { // business work after the row, for three leases
			case <-ctx.Done():
			case <-time.After(3 * time.Second):
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence); err != nil {
				return nil, err
			}
			return []byte("paid"), tx.Commit()
		})
		rows, _ := pgenv.CountPayments(t, db)
		switch {
		case step && (err != nil || rows != 1):
			t.Fatalf("a step's transaction past its lease: %v, %d payments; want it kept alive, 1 payment", err, rows)
		case !step && (err == nil || rows != 0):
			t.Fatalf("work after Commit past the lease: %v, %d payments; want the run ended, none", err, rows)
		}
	}
}
