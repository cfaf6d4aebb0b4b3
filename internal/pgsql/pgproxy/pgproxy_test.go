package pgproxy_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

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

// TestCutsAfterSend: a statement armed by CutAfterSend reaches the server
// whole, and the server runs and commits it after the client's connection
// was cut: here it waits for an advisory lock the test holds, the cut
// (held by HoldCut until the server has it waiting) closes the client's
// connection, database/sql sends it again, and once the lock is released
// both sends commit. Later statements go through.
func TestCutsAfterSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	direct, dsn := testenv.Postgres(t)
	p, db := pgproxy.New(t, dsn)
	if _, err := db.ExecContext(ctx, `CREATE TABLE cut (n int)`); err != nil {
		t.Fatal(err)
	}
	lock, err := direct.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	key := time.Now().UnixNano()
	var holder int
	if err := lock.QueryRowContext(ctx, `SELECT pg_backend_pid() FROM pg_advisory_lock($1)`, key).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) func() bool {
		return func() bool {
			var got int
			_ = direct.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&got)
			return got >= n
		}
	}

	sent, release := p.HoldCut(t)
	p.CutAfterSend("INSERT INTO cut")
	done := make(chan error, 1)
	go func() {
		_, err := db.ExecContext(ctx, `INSERT INTO cut SELECT $1 FROM pg_advisory_xact_lock($2)`, 1, key)
		done <- err
	}()
	<-sent
	testenv.WaitFor(t, 30*time.Second, "the statement to wait for the lock at the server", waiting(1))
	if p.Cuts() != 0 {
		t.Fatalf("cuts = %d before the hold was released", p.Cuts())
	}
	release()
	testenv.WaitFor(t, 30*time.Second, "the repeat to wait for the lock too", waiting(2))
	if _, err := lock.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the repeat through the proxy: %v", err)
	}
	var rows int
	testenv.WaitFor(t, 30*time.Second, "both sends to commit", func() bool {
		_ = direct.QueryRowContext(ctx, `SELECT count(*) FROM cut`).Scan(&rows)
		return rows == 2
	})
	if p.Cuts() != 1 {
		t.Fatalf("cuts = %d, want 1", p.Cuts())
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO cut VALUES ($1)`, 2); err != nil {
		t.Fatalf("through the proxy after the cut: %v", err)
	}
}
