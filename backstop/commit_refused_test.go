package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// TestRefusedCommitIsNotUnavailable: a business transaction whose COMMIT
// PostgreSQL refused for good (a deferred unique constraint, checked at
// COMMIT: SQLSTATE 23505) was rolled back, its outcome known: Func and
// Step answer a plain error. Step answered guard.ErrUnavailable ("retry
// later"), every retry alike (found by review).
func TestRefusedCommitIsNotUnavailable(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (ref text,
		CONSTRAINT orders_ref UNIQUE (ref) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO orders VALUES ('taken')`); err != nil {
		t.Fatal(err)
	}
	insert := func(ctx context.Context, tx *sql.Tx, _ guard.Lease) ([]byte, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders VALUES ('taken')`) // refused at COMMIT
		return []byte("ok"), err
	}
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})

	_, ferr := g.Do(ctx, newKey(t), "fp", b.Func("fp", insert))
	if ferr == nil || errors.Is(ferr, guard.ErrUnavailable) {
		t.Errorf("Func whose COMMIT was refused (23505) = %v; want a plain error", ferr)
	}
	_, serr := g.Do(ctx, newKey(t), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		return b.Step(ctx, l, "order", insert)
	})
	if serr == nil || errors.Is(serr, guard.ErrUnavailable) {
		t.Errorf("Step whose COMMIT was refused (23505) = %v; want a plain error, as Func's", serr)
	}
}
