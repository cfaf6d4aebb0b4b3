package occ_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// blocked reports whether at least n backends wait, directly or behind
// another waiter, for the locks of the backend holder.
func blocked(db *sql.DB, holder, n int) bool {
	var got int
	_ = db.QueryRowContext(ctx, `WITH first AS (SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))
		SELECT count(*) FROM pg_stat_activity
		WHERE $1 = ANY(pg_blocking_pids(pid)) OR pg_blocking_pids(pid) && ARRAY(SELECT pid FROM first)`, holder).Scan(&got)
	return got >= n
}

// sentTwiceBehindLock runs write, whose statement holding marker goes
// through p, while the test holds the row lock lockRow takes (a SELECT
// pg_backend_pid() ... FOR UPDATE): p cuts the client's connection once
// the statement has been sent, and holds the cut until that first send
// queues for the row lock at the server; database/sql sends the statement
// again on another connection, which queues behind it. Then the lock is
// released, and write's error returned.
func sentTwiceBehindLock(t *testing.T, p *pgproxy.Proxy, direct *sql.DB, lockRow, marker string, write func() error) error {
	t.Helper()
	lock, err := direct.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback() }()
	var holder int
	if err := lock.QueryRowContext(ctx, lockRow).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	sent, release := p.HoldCut(t)
	p.CutAfterSend(marker)
	done := make(chan error, 1)
	go func() { done <- write() }()
	<-sent
	testenv.WaitFor(t, 30*time.Second, "the first send to wait for the row lock", func() bool { return blocked(direct, holder, 1) })
	release()
	testenv.WaitFor(t, 30*time.Second, "its repeat to wait behind it", func() bool { return blocked(direct, holder, 2) })
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// TestVersionedUpdateRepeatSerializationFailure: an Update through a pool
// type whose connection died after the statement went out, while
// PostgreSQL still had it waiting for a row lock. database/sql sends it
// again on another connection; it queues behind the first, which then
// applies; under REPEATABLE READ or SERIALIZABLE (a server's or role's
// default_transaction_isolation) the repeat fails with a serialization
// failure (40001) instead of matching no row. Update returned that as a
// conflict, though it had sent the statement twice, and UpdateRetry read
// the row afresh and applied the deposit a second time: 10 made 20.
func TestVersionedUpdateRepeatSerializationFailure(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	acc := accountsTable(t, direct)
	p, db := pgproxy.New(t, testenv.DSNWithIsolation(t, dsn, "repeatable read"))
	before, _ := readAccount(t, direct)

	err := sentTwiceBehindLock(t, p, direct, `SELECT pg_backend_pid() FROM occ_accounts WHERE id = 1 FOR UPDATE`, `UPDATE "occ_accounts"`, func() error {
		_, err := acc.UpdateRetry(ctx, appDB{db}, 1, occ.RetryOptions{MaxTries: 3}, func(ctx context.Context) (int64, map[string]any, error) {
			var balance, version int64
			err := direct.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&balance, &version)
			return version, map[string]any{"balance": balance + 10}, err
		})
		return err
	})
	after, _ := readAccount(t, direct)
	switch {
	case after-before > 10:
		t.Fatalf("a deposit of 10 sent twice moved the balance by %d (UpdateRetry: %v)", after-before, err)
	case err == nil:
		t.Fatalf("UpdateRetry succeeded; its first send's connection was cut (balance moved by %d)", after-before)
	case occ.IsConflict(err):
		t.Fatalf("UpdateRetry = %v; an update sent twice, whose first send may have applied, is not a conflict", err)
	case !errors.Is(err, occ.ErrUnavailable) || !strings.Contains(err.Error(), "could not serialize"):
		t.Fatalf("UpdateRetry = %v; want ErrUnavailable after a repeat that met a serialization failure (else the test proves nothing)", err)
	}
	t.Logf("balance moved by %d; UpdateRetry: %v", after-before, err)
}

// TestVectorWriteRepeatSerializationFailure: the lost send of
// TestVersionedUpdateRepeatSerializationFailure, for VectorTable.Write. The
// repeat, queued behind the first send, fails with a serialization failure;
// Write returned it as a conflict (carrying no versions: "run the
// transaction again"), and the application, re-reading and writing its
// change on what it read (its own first write already there), made a
// deposit of 10 twice.
func TestVectorWriteRepeatSerializationFailure(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	tbl := cartsTable(t, direct, "w")
	if _, err := tbl.Write(ctx, direct, "c", occ.Vector{}, []byte(`100`)); err != nil {
		t.Fatal(err)
	}
	balance := func() int64 {
		t.Helper()
		v, err := tbl.Read(ctx, direct, "c")
		if err != nil {
			t.Fatal(err)
		}
		n, err := strconv.ParseInt(string(v.Value), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	p, db := pgproxy.New(t, testenv.DSNWithIsolation(t, dsn, "repeatable read"))
	err := sentTwiceBehindLock(t, p, direct, `SELECT pg_backend_pid() FROM occ_carts WHERE id = 'c' FOR UPDATE`, `UPDATE "occ_carts"`, func() error {
		return occ.RetryOnConflict(ctx, occ.RetryOptions{MaxTries: 3}, func(ctx context.Context) error {
			v, err := tbl.Read(ctx, direct, "c")
			if err != nil {
				return err
			}
			n, err := strconv.ParseInt(string(v.Value), 10, 64)
			if err != nil {
				return err
			}
			_, err = tbl.Write(ctx, appDB{db}, "c", v.Vector, []byte(strconv.FormatInt(n+10, 10)))
			return err
		})
	})
	switch moved := balance() - 100; {
	case moved > 10:
		t.Fatalf("a deposit of 10 sent twice moved the balance by %d (RetryOnConflict: %v)", moved, err)
	case err == nil:
		t.Fatalf("the write succeeded; its first send's connection was cut (balance moved by %d)", moved)
	case occ.IsConflict(err):
		t.Fatalf("Write = %v; a write sent twice, whose first send may have applied, is not a conflict", err)
	case !errors.Is(err, occ.ErrUnavailable) || !strings.Contains(err.Error(), "could not serialize"):
		t.Fatalf("Write = %v; want ErrUnavailable after a repeat that met a serialization failure (else the test proves nothing)", err)
	}
}
