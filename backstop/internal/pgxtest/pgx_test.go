package pgxtest

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// openPgx opens, through pgx, the fresh schema testenv.Postgres made.
func openPgx(t *testing.T) *sql.DB {
	t.Helper()
	_, dsn := testenv.Postgres(t)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// TestBackstopThroughPgx: the backstop works unchanged on pgx's driver
// (a commit, then ErrAlreadyCommitted with the stored result), and a pgx
// failure that means the database cannot do the work now, a backend
// terminated by an administrator, is recognised as guard.ErrUnavailable.
func TestBackstopThroughPgx(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := openPgx(t)
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatalf("Migrate through pgx: %v", err)
	}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "payments", ID: "pgx-1"}
	commit := func(tx *sql.Tx, token string, fence int64) error {
		return b.Commit(ctx, tx, guard.Lease{Key: key, Token: token, Fence: fence, Attempt: 1}, "fp", []byte("receipt-"+token))
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := commit(tx, "A", 1); err != nil {
		t.Fatalf("Commit through pgx: %v", err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = commit(tx, "B", 2)
	_ = tx.Rollback()
	var done *backstop.AlreadyCommittedError
	if !errors.As(err, &done) || string(done.Result) != "receipt-A" {
		t.Fatalf("second Commit = %v, want AlreadyCommittedError with receipt-A", err)
	}

	// A transaction whose backend an administrator terminates.
	tx, err = db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var pid int
	if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var killed bool
	if err := db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend = %v, %v", killed, err)
	}
	err = b.Commit(ctx, tx, guard.Lease{Key: guard.Key{Scope: "payments", ID: "pgx-2"}, Token: "C", Fence: 1, Attempt: 1}, "fp", nil)
	t.Logf("Commit after pg_terminate_backend through pgx: %v", err)
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Commit on a terminated backend = %v, want guard.ErrUnavailable", err)
	}
}

// TestPgxServerErrorsBySQLState: errors a real server raises reach the
// classification as *pgconn.PgError, through its SQLState method:
// serialization failure, deadlock and "cannot connect now" are
// guard.ErrUnavailable for the Postgres Store; a unique violation is not.
func TestPgxServerErrorsBySQLState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db := openPgx(t)
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	// A trigger makes the Store's claim fail with the chosen SQLSTATE, so
	// the error comes from the server through the Store's own statement.
	if _, err := db.ExecContext(ctx, `CREATE FUNCTION fail_with() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = NEW.fingerprint; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TRIGGER fail_with BEFORE INSERT ON idemguard_keys FOR EACH ROW EXECUTE FUNCTION fail_with()`); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for code, want := range map[string]bool{"40001": true, "40P01": true, "57P03": true, "08006": true, "23505": false, "22023": false} {
		_, err := s.Claim(ctx, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "k-" + code}, Token: "A",
			Fingerprint: code, Lease: time.Second, TTL: time.Minute})
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != code {
			t.Fatalf("claim with %s: %v, want a *pgconn.PgError with that code", code, err)
		}
		if got := errors.Is(err, guard.ErrUnavailable); got != want {
			t.Errorf("SQLSTATE %s through pgx: unavailable = %v, want %v (%v)", code, got, want, err)
		}
	}
}
