package pgproxy_test

import (
	"context"
	"database/sql"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestLosesReply: the proxy itself. A statement whose replies are
// lost fails at the client though it committed at the server (once per
// time database/sql sent it), and statements go through again once the
// proxy is disarmed.
func TestLosesReply(t *testing.T) {
	t.Parallel()
	_, dsn := testenv.Postgres(t)
	direct, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	p, db := pgproxy.New(t, dsn)
	if _, err := db.ExecContext(context.Background(), `CREATE TABLE cut (n int)`); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		var n int
		if err := direct.QueryRowContext(context.Background(), `SELECT count(*) FROM cut`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	p.LoseReplies("INSERT INTO cut")
	if _, err := db.ExecContext(context.Background(), `INSERT INTO cut VALUES ($1)`, 1); err == nil {
		t.Fatalf("insert whose replies were lost succeeded (cuts %d)", p.Cuts())
	}
	p.KeepReplies()
	if n := count(); p.Cuts() < 1 || int64(n) != p.Cuts() {
		t.Fatalf("rows committed = %d, replies lost = %d; want as many, at least one", n, p.Cuts())
	}
	if _, err := db.ExecContext(context.Background(), `INSERT INTO cut VALUES ($1)`, 2); err != nil {
		t.Fatalf("through the proxy disarmed: %v", err)
	}
}
