package occ_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemguard/idemguard/occ"
)

// txKey carries a *sql.Tx in a context, for ctxDB.
type txKey struct{}

// ctxDB is a pattern applications use to keep their repositories unaware
// of transactions: a type that embeds the pool (for BeginTx and the rest)
// and runs every statement on the transaction the context carries, if it
// carries one, and on the pool otherwise.
type ctxDB struct{ *sql.DB }

func (d ctxDB) on(ctx context.Context) occ.Querier {
	if tx, ok := ctx.Value(txKey{}).(*sql.Tx); ok {
		return tx
	}
	return d.DB
}

func (d ctxDB) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return d.on(ctx).ExecContext(ctx, query, args...)
}

func (d ctxDB) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return d.on(ctx).QueryContext(ctx, query, args...)
}

func (d ctxDB) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return d.on(ctx).QueryRowContext(ctx, query, args...)
}

// TestUpdateThroughContextRoutingDB: Update through a ctxDB, in a context
// carrying the caller's transaction, runs in that transaction, beside the
// business effect: it commits with it and is rolled back with it. Update
// took a connection of its own from any Querier with a Conn method (the
// embedded pool's), so the update ran outside the transaction: committed
// at once whatever the transaction did, and, with the business effect
// holding the row's lock, waiting on the caller's own transaction forever.
func TestUpdateThroughContextRoutingDB(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		effect string // the business effect, in the transaction
		commit bool
	}{
		{"commit", `INSERT INTO occ_accounts (id, balance, note) VALUES (2, 0, 'paid')`, true},
		{"rollback", `INSERT INTO occ_accounts (id, balance, note) VALUES (2, 0, 'paid')`, false},
		{"commit/same row", `UPDATE occ_accounts SET note = 'paid' WHERE id = 1`, true},
		{"rollback/same row", `UPDATE occ_accounts SET note = 'paid' WHERE id = 1`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := database(t)
			acc := accountsTable(t, db)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			tctx, cancel := context.WithTimeout(context.WithValue(ctx, txKey{}, tx), 10*time.Second)
			defer cancel()
			if _, err := tx.ExecContext(tctx, tc.effect); err != nil {
				t.Fatal(err)
			}
			next, err := acc.Update(tctx, ctxDB{db}, 1, 1, map[string]any{"balance": 110})
			if err != nil || next != 2 {
				t.Fatalf("Update in the context's transaction = %d, %v; want 2, nil", next, err)
			}
			if tc.commit {
				err = tx.Commit()
			} else {
				err = tx.Rollback()
			}
			if err != nil {
				t.Fatal(err)
			}
			balance, version := readAccount(t, db)
			var paid int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM occ_accounts WHERE note = 'paid'`).Scan(&paid); err != nil {
				t.Fatal(err)
			}
			want := [3]int64{0, 100, 1} // effects paid, balance, version
			if tc.commit {
				want = [3]int64{1, 110, 2}
			}
			if got := [3]int64{int64(paid), balance, version}; got != want {
				t.Fatalf("after %s: effects, balance, version = %v, want %v: the update did not share the business effect's transaction", tc.name, got, want)
			}
		})
	}
}
