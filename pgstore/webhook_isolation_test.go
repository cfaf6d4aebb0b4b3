package pgstore_test

import (
	"testing"

	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestInsertOrRetryStrictIsolation: on a database whose default
// isolation is REPEATABLE READ, InsertOrRetry on a *sql.DB is run again
// when it loses a race, as the Store's own statements are (retry.go;
// docs/design.md: "a statement refused with a serialization failure or a
// deadlock changed nothing and is run again"): a duplicate delivery that
// waited for another writer of the pending row (a concurrent
// InsertOrRetry in a transaction) counts its retry, as at READ COMMITTED.
// (It ran once, and answered the 40001 as ErrUnavailable.)
func TestInsertOrRetryStrictIsolation(t *testing.T) {
	direct, db, waitLocked := pgenv.Isolated(t, "repeatable read")
	s := pgenv.Store(t, db, pgstore.Options{})
	ds := pgenv.Store(t, direct, pgstore.Options{})
	if _, err := s.InsertOrRetry(ctx, db, "order.shipped", "ord_9", nil); err != nil {
		t.Fatal(err)
	}

	// Another sender counts its retry inside a transaction of its own.
	tx, err := direct.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := ds.InsertOrRetry(ctx, tx, "order.shipped", "ord_9", nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.InsertOrRetry(ctx, db, "order.shipped", "ord_9", nil)
		done <- err
	}()
	waitLocked("the duplicate to wait for the other's row lock")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("InsertOrRetry that waited for a concurrent retry (REPEATABLE READ) = %v; want its retry counted, as at READ COMMITTED", err)
	}
	var attempts int
	if err := direct.QueryRowContext(ctx, `SELECT attempt_count FROM idemguard_webhook_deliveries WHERE ref_id = 'ord_9'`).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 3 {
		t.Fatalf("attempt_count %d, want 3", attempts)
	}
}
