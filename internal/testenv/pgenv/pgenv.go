// Package pgenv gives the PostgreSQL tests a migrated schema of their own
// and the payments table their effects write (apart from testenv, which
// must not import pgstore: pgstore's in-package tests use testenv).
package pgenv

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/sqlstate"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// Migrated returns a database in a fresh schema (testenv.Postgres) with
// idemguard's tables created under opts.
func Migrated(t testing.TB, opts pgstore.Options) *sql.DB {
	t.Helper()
	db, _ := testenv.Postgres(t)
	if err := pgstore.Migrate(context.Background(), db, opts); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db
}

// PaymentsTable creates the table the tests' effects write: deliberately
// without a unique constraint, so only the backstop keeps effects single.
func PaymentsTable(t testing.TB, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), `CREATE TABLE payments (
		n bigint GENERATED ALWAYS AS IDENTITY, key text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

// CountPayments returns how many payment rows there are, and for how many
// distinct keys.
func CountPayments(t testing.TB, db *sql.DB) (rows, keys int) {
	t.Helper()
	if err := db.QueryRowContext(context.Background(), `SELECT count(*), count(DISTINCT key) FROM payments`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	return rows, keys
}

// Store returns a pgstore.Store on db, failing the test if New refuses.
func Store(t testing.TB, db *sql.DB, opts pgstore.Options) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(db, opts)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	return s
}

// Exec runs q on db, failing the test if it fails.
func Exec(t testing.TB, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// WantMissingTable fails the test unless err is what pgstore and backstop
// return for a table that was never created: the driver's own error
// (SQLSTATE 42P01, undefined_table) still in the chain, not classified as
// guard.ErrUnavailable (no retry makes the table), with a message that
// says to run pgstore.Migrate. what names the call in the failure.
func WantMissingTable(t testing.TB, what string, err error) {
	t.Helper()
	switch code, _ := sqlstate.Code(err); {
	case err == nil:
		t.Errorf("%s on tables never migrated: no error", what)
	case code != "42P01":
		t.Errorf("%s = %v (SQLSTATE %q); want the driver's undefined_table error (42P01) in the chain", what, err, code)
	case errors.Is(err, guard.ErrUnavailable):
		t.Errorf("%s = %v; a missing table is not unavailable", what, err)
	case !strings.Contains(err.Error(), "create the tables with pgstore.Migrate"):
		t.Errorf("%s = %v; want it to say to create the tables with pgstore.Migrate", what, err)
	}
}

// ReadOnly opens dsn (a URL, as testenv.Postgres returns) with
// default_transaction_read_only = on, as for a role or session made read
// only, and closes it when the test ends. A statement outside a
// transaction is then refused a write with SQLSTATE 25006, as on a hot
// standby; a transaction lib/pq begins is not read only (it begins every
// one READ WRITE, or READ ONLY when asked), where a hot standby refuses
// to begin it (0A000).
func ReadOnly(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("default_transaction_read_only", "on")
	u.RawQuery = q.Encode()
	db, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	var ro string
	if err := db.QueryRowContext(context.Background(), `SHOW transaction_read_only`).Scan(&ro); err != nil || ro != "on" {
		t.Fatalf("transaction_read_only = %q, %v; want on", ro, err)
	}
	return db
}
