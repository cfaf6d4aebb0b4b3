package occ_test

import (
	"context"
	"database/sql"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

// database returns a handle whose search_path is a schema of the test's
// own (testenv drops it when the test ends), so tests never share a table.
func database(t testing.TB) *sql.DB {
	t.Helper()
	db, _ := testenv.Postgres(t)
	return db
}

func mustExec(t testing.TB, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
