package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
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
	s := backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)

	t.Run("commit", func(t *testing.T) {
		rows, _, err := payAfterRow(t, db, b, s, time.Second, false)
		if err == nil || rows != 0 {
			t.Fatalf("work after Commit past the lease: %v, %d payments; want the run ended, none", err, rows)
		}
	})
	t.Run("step", func(t *testing.T) {
		// Every heartbeat (one a third of a lease) must be answered within
		// a lease: one a loaded machine held back past it loses the lease
		// as a locked row would (make test: "context canceled, 0
		// payments"). Such a round proves nothing and runs again with a
		// lease twice as long. A row the step's transaction did lock holds
		// every extension back whatever the lease, so every round is then
		// lost and the test fails.
		testenv.OnTime(t, "a lease", time.Second, 3, func(lease time.Duration) bool {
			rows, lost, err := payAfterRow(t, db, b, s, lease, true)
			if (err != nil || rows != 1) && lost {
				t.Logf("the lease of %s was lost: %v, %d payments", lease, err, rows)
				return true
			}
			if err != nil || rows != 1 {
				t.Fatalf("a step's transaction past its lease: %v, %d payments; want it kept alive, 1 payment", err, rows)
			}
			return false
		})
	})
}

// payAfterRow runs one key through g: a transaction that writes the key's
// row (CommitStep if step, else Commit), works three leases, then inserts
// a payment and commits. It returns how many payments the key has after,
// whether the run's context ended because its lease was lost, and Do's
// error.
func payAfterRow(t *testing.T, db *sql.DB, b *backstop.Backstop, s guard.Store, lease time.Duration, step bool) (payments int, lost bool, _ error) {
	t.Helper()
	g := guard.New(s, guard.Options{Lease: lease})
	key := newKey(t)
	var run context.Context
	_, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		run = ctx
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
			return nil, fmt.Errorf("work after the row: %w", context.Cause(ctx))
		case <-time.After(3 * lease):
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence); err != nil {
			return nil, err
		}
		return []byte("paid"), tx.Commit()
	})
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE key = $1`, key.String()).Scan(&payments); err != nil {
		t.Fatal(err)
	}
	return payments, run != nil && errors.Is(context.Cause(run), guard.ErrLeaseLost), err
}
