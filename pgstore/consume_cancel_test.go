package pgstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestConsumeCancelledBeforeCommit: a Consume whose context is
// cancelled after fn returned nil, before the commit, keeps nothing
// (database/sql rolls the transaction back) and reports the cancellation
// as context.Canceled. (Commit's sql.ErrTxDone came back as a plain
// "postgres commit" error, neither the cancellation nor
// guard.ErrUnavailable, as if the handler had failed.)
func TestConsumeCancelledBeforeCommit(t *testing.T) {
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ran, err := s.Consume(cctx, "g", "m", func(_ context.Context, tx *sql.Tx) error {
		cancel() // the consumer shuts down as the handler ends
		testenv.WaitFor(t, 10*time.Second, "database/sql to roll the cancelled transaction back", func() bool {
			_, err := tx.ExecContext(context.Background(), `SELECT 1`)
			return errors.Is(err, sql.ErrTxDone)
		})
		return nil
	})
	var n int
	if qerr := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_consumed_messages`).Scan(&n); qerr != nil {
		t.Fatal(qerr)
	}
	if ran || n != 0 {
		t.Fatalf("Consume = %v, %v with %d marks; want nothing kept", ran, err, n)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Consume cancelled before its commit = %v; want context.Canceled", err)
	}
}
