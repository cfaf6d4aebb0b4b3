package pgstore_test

import (
	"context"
	"database/sql"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

// migrated returns a database in a fresh schema with the tables created.
func migrated(t testing.TB, opts pgstore.Options) *sql.DB {
	t.Helper()
	db, _ := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, db, opts); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return db
}

// businessTable creates the table the tests' effects write: deliberately
// without a unique constraint, so only the backstop keeps effects single.
func businessTable(t testing.TB, db *sql.DB) {
	t.Helper()
	if _, err := db.ExecContext(ctx, `CREATE TABLE payments (
		n bigint GENERATED ALWAYS AS IDENTITY, key text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func countPayments(t testing.TB, db *sql.DB) (rows, keys int) {
	t.Helper()
	if err := db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT key) FROM payments`).Scan(&rows, &keys); err != nil {
		t.Fatal(err)
	}
	return rows, keys
}

// mustStore returns a Store on db, failing the test if New refuses.
func mustStore(t testing.TB, db *sql.DB, opts pgstore.Options) *pgstore.Store {
	t.Helper()
	s, err := pgstore.New(db, opts)
	if err != nil {
		t.Fatalf("pgstore.New: %v", err)
	}
	return s
}

func mustExec(t testing.TB, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
