package occ_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// TestVersionedUpdateReplyLost: an Update that PostgreSQL applied but whose
// reply was lost must not pass for a conflict. lib/pq reports such a
// connection bad, and database/sql then sends the statement again on
// another connection, where it matches no row (the version moved on: by
// this very update). Answered as ErrConflict, UpdateRetry read the row
// afresh and applied the change a second time: a deposit of 10 made 20.
// The outcome is unknown to the caller, so the answer must be an error
// that is not a conflict (ErrUnavailable), and the change made at most
// once.
func TestVersionedUpdateReplyLost(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	acc := accountsTable(t, direct)
	p, db := pgproxy.New(t, dsn)
	before, _ := readAccount(t, direct)
	p.LoseReply(`UPDATE "occ_accounts"`)
	_, err := acc.UpdateRetry(ctx, db, 1, occ.RetryOptions{}, func(ctx context.Context) (int64, map[string]any, error) {
		var balance, version int64
		err := db.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&balance, &version)
		return version, map[string]any{"balance": balance + 10}, err
	})
	p.KeepReplies()
	if p.Cuts() != 1 {
		t.Fatalf("replies lost: %d, want 1: the test proves nothing", p.Cuts())
	}
	after, _ := readAccount(t, direct)
	switch {
	case after-before > 10:
		t.Fatalf("a deposit of 10 whose reply was lost moved the balance by %d (UpdateRetry: %v)", after-before, err)
	case err == nil && after-before != 10:
		t.Fatalf("UpdateRetry succeeded but the balance moved by %d", after-before)
	case err != nil && occ.IsConflict(err):
		t.Fatalf("UpdateRetry = %v; an update whose outcome is unknown is not a conflict", err)
	}
	t.Logf("balance moved by %d; UpdateRetry: %v", after-before, err)
}

// appDB is how applications often hand their pool around: a type of their
// own that embeds *sql.DB (sqlx.DB is one). It is a Querier, and its
// statements run through *sql.DB's, which send a statement again when the
// driver reports the connection bad.
type appDB struct{ *sql.DB }

// TestVersionedUpdateReplyLostWrappedDB: the lost reply of
// TestVersionedUpdateReplyLost, through a pool wrapped in the
// application's own type. Update runs the statement through the type's
// own methods (they may route it to the context's transaction: see
// TestUpdateThroughContextRoutingDB), so database/sql sends it again; the
// repeat must not read as a conflict, or UpdateRetry applies the deposit a
// second time.
func TestVersionedUpdateReplyLostWrappedDB(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	acc := accountsTable(t, direct)
	p, db := pgproxy.New(t, dsn)
	before, _ := readAccount(t, direct)
	p.LoseReply(`UPDATE "occ_accounts"`)
	_, err := acc.UpdateRetry(ctx, appDB{db}, 1, occ.RetryOptions{}, func(ctx context.Context) (int64, map[string]any, error) {
		var balance, version int64
		err := db.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&balance, &version)
		return version, map[string]any{"balance": balance + 10}, err
	})
	p.KeepReplies()
	if p.Cuts() != 1 {
		t.Fatalf("replies lost: %d, want 1: the test proves nothing", p.Cuts())
	}
	after, _ := readAccount(t, direct)
	switch {
	case after-before > 10:
		t.Fatalf("a deposit of 10 whose reply was lost moved the balance by %d (UpdateRetry: %v)", after-before, err)
	case err == nil && after-before != 10:
		t.Fatalf("UpdateRetry succeeded but the balance moved by %d", after-before)
	case err != nil && occ.IsConflict(err):
		t.Fatalf("UpdateRetry = %v; an update whose outcome is unknown is not a conflict", err)
	}
}
