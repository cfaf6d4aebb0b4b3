package occ_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/occ"
)

// appTx is a transaction in a type of the application's (sqlx.Tx is one):
// it embeds *sql.Tx, so it is a Querier, but it is not a *sql.Tx.
type appTx struct{ *sql.Tx }

// TestUpdateRetryInTransactionConflict: UpdateRetry on a REPEATABLE READ
// transaction whose update loses to a commit made after its snapshot.
// PostgreSQL fails the update with a serialization failure (40001) and
// aborts the transaction: only running the whole transaction again helps.
// UpdateRetry must hand that conflict back (ErrConflict, SQLSTATE kept),
// not try again inside the aborted transaction, whose next statement fails
// with "current transaction is aborted" (25P02), an error that says nothing
// of a conflict, so the caller cannot tell to run its transaction again.
// The transaction is reached as a *sql.Tx, and through a type that is not
// one: one embedding it, and a pool that runs statements on the context's
// transaction (ctxDB). UpdateRetry told an aborted transaction by q's
// type, so through these it read again in the aborted transaction and
// returned 25P02, the serialization failure lost.
func TestUpdateRetryInTransactionConflict(t *testing.T) {
	t.Parallel()
	for name, wrap := range map[string]func(db *sql.DB, tx *sql.Tx) (context.Context, occ.Querier){
		"sql.Tx":   func(_ *sql.DB, tx *sql.Tx) (context.Context, occ.Querier) { return ctx, tx },
		"embedded": func(_ *sql.DB, tx *sql.Tx) (context.Context, occ.Querier) { return ctx, appTx{tx} },
		"context": func(db *sql.DB, tx *sql.Tx) (context.Context, occ.Querier) {
			return context.WithValue(ctx, txKey{}, tx), ctxDB{db}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := database(t)
			acc := accountsTable(t, db)
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			qctx, q := wrap(db, tx)
			reads := 0
			_, err = acc.UpdateRetry(qctx, q, 1, occ.RetryOptions{}, func(ctx context.Context) (int64, map[string]any, error) {
				reads++
				var balance, version int64
				err := q.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&balance, &version)
				if err == nil && reads == 1 { // another writer commits after this transaction's snapshot
					mustExec(t, db, `UPDATE occ_accounts SET balance = balance + 1, version = version + 1 WHERE id = 1`)
				}
				return version, map[string]any{"balance": balance + 10}, err
			})
			var pe *pq.Error
			if !errors.Is(err, occ.ErrConflict) || !errors.As(err, &pe) || pe.Code != "40001" {
				t.Fatalf("UpdateRetry in a transaction that lost the race = %v after %d reads; want ErrConflict with SQLSTATE 40001", err, reads)
			}
			if reads != 1 {
				t.Fatalf("read %d times: tried again inside an aborted transaction", reads)
			}
		})
	}
}

// TestUpdateRetryInTransactionReadConflict: a serialization failure that
// read returns (a SERIALIZABLE read can fail so) also ends UpdateRetry on
// a transaction, matching ErrConflict, the driver's error kept: PostgreSQL
// aborted the transaction (the read raises the failure in it).
func TestUpdateRetryInTransactionReadConflict(t *testing.T) {
	t.Parallel()
	db := database(t)
	acc := accountsTable(t, db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	reads := 0
	_, err = acc.UpdateRetry(ctx, tx, 1, occ.RetryOptions{}, func(ctx context.Context) (int64, map[string]any, error) {
		reads++
		_, err := tx.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = 'serialization_failure'; END $$`)
		return 0, nil, err
	})
	var pe *pq.Error
	if !errors.Is(err, occ.ErrConflict) || !errors.As(err, &pe) || pe.Code != "40001" || reads != 1 {
		t.Fatalf("UpdateRetry whose read failed with 40001 = %v after %d reads; want ErrConflict after 1", err, reads)
	}
}

// TestUpdateRetryInTransactionReadConflictElsewhere: a serialization
// failure that read returns from another transaction (its own
// SERIALIZABLE one, say) leaves q's transaction usable, and UpdateRetry
// tries again in it, as it does for any conflict. It had returned the
// failure at once whenever q was a *sql.Tx, telling the caller to run
// again a transaction nothing had aborted.
func TestUpdateRetryInTransactionReadConflictElsewhere(t *testing.T) {
	t.Parallel()
	db := database(t)
	acc := accountsTable(t, db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	reads := 0
	next, err := acc.UpdateRetry(ctx, tx, 1, occ.RetryOptions{InitialInterval: time.Millisecond}, func(ctx context.Context) (int64, map[string]any, error) {
		reads++
		if reads == 1 { // as a failed transaction of read's own reports it
			return 0, nil, &pq.Error{Code: "40001", Message: "could not serialize access"}
		}
		var balance, version int64
		err := tx.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&balance, &version)
		return version, map[string]any{"balance": balance + 10}, err
	})
	if err != nil || next != 2 || reads != 2 {
		t.Fatalf("UpdateRetry whose first read failed elsewhere = %d, %v after %d reads; want 2, nil after 2", next, err, reads)
	}
}

// TestRetryOnConflictLastTryError: an error that is not a conflict is
// returned as it is, on the last try too (backoff's Retry hands back its
// Permanent wrapper there, which err == sql.ErrNoRows, a type switch on the
// driver's error type, or a test of identity did not see through).
func TestRetryOnConflictLastTryError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, maxTries := range []uint{1, 2, 3} {
		tries := 0
		err := occ.RetryOnConflict(ctx, occ.RetryOptions{MaxTries: maxTries, InitialInterval: time.Microsecond}, func(context.Context) error {
			tries++
			if tries < int(maxTries) {
				return occ.ErrConflict
			}
			return boom
		})
		if err != boom || tries != int(maxTries) { // identity is the point
			t.Errorf("MaxTries %d: RetryOnConflict = %#v after %d tries, want boom itself after %d", maxTries, err, tries, maxTries)
		}
	}
}
