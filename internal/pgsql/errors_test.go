package pgsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
	"github.com/lib/pq/pqerror"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
	"github.com/idemguard/idemguard/internal/testenv"
)

// stateErr is an error value carrying a SQLSTATE code the way any driver's
// server error does (an error value, not a mock of a store).
type stateErr string

func (e stateErr) Error() string    { return "server said " + string(e) }
func (e stateErr) SQLState() string { return string(e) }

// TestUnavailableBySQLState: the classification reads the SQLSTATE code of
// any error that has a SQLState method, wrapped or not, whatever its type:
// lib/pq's *pq.Error and a driver-neutral value alike.
func TestUnavailableBySQLState(t *testing.T) {
	for code, want := range map[string]bool{
		"08000": true, "08001": true, "08003": true, "08006": true, // connection exception
		"53000": true, "53100": true, "53200": true, "53300": true, // insufficient resources
		"57P01": true, "57P02": true, "57P03": true, // admin/crash shutdown, cannot connect now
		"40001": true, "40P01": true, // serialization failure, deadlock
		"57014": true, "55P03": true, // statement_timeout (or pg_cancel_backend), lock_timeout
		"25006": true,  // a write in a read-only transaction (a hot standby)
		"0A000": false, // feature_not_supported: unavailable only from BeginTx, on a server in recovery
		"23505": false, "23503": false, "42P01": false, "22P02": false, "40002": false, "55000": false,
	} {
		for name, err := range map[string]error{
			"value":        stateErr(code),
			"wrapped":      fmt.Errorf("query: %w", stateErr(code)),
			"lib/pq":       &pq.Error{Code: pqerror.Code(code)},
			"wrapped pq":   fmt.Errorf("query: %w", &pq.Error{Code: pqerror.Code(code)}),
			"joined value": errors.Join(errors.New("rollback failed"), stateErr(code)),
		} {
			if got := pgsql.Unavailable(err); got != want {
				t.Errorf("%s %s: Unavailable = %v, want %v", name, code, got, want)
			}
			if got, ok := pgsql.SQLState(err); !ok || got != code {
				t.Errorf("%s %s: SQLState = %q, %v", name, code, got, ok)
			}
			mapped := pgsql.Err(context.Background(), "commit", err)
			if errors.Is(mapped, guard.ErrUnavailable) != want {
				t.Errorf("%s %s: Err = %v, unavailable %v; want %v", name, code, mapped, !want, want)
			}
			if !errors.Is(mapped, err) {
				t.Errorf("%s %s: Err = %v does not wrap the driver's error", name, code, mapped)
			}
		}
	}
}

// TestMissingTableHint: a missing table (42P01) is wrapped plainly, as
// before, the driver's error kept, with the hint to run the migrations;
// no other error gets the hint. A real server's error too.
func TestMissingTableHint(t *testing.T) {
	bg := context.Background()
	for _, err := range []error{stateErr("42P01"), fmt.Errorf("query: %w", &pq.Error{Code: "42P01"})} {
		mapped := pgsql.Err(bg, "claim", err)
		if !errors.Is(mapped, err) || errors.Is(mapped, guard.ErrUnavailable) ||
			!strings.Contains(mapped.Error(), pgsql.MigrateHint) || !strings.HasPrefix(mapped.Error(), "postgres claim: ") {
			t.Errorf("Err(%v) = %v; want it wrapped, not unavailable, with the hint", err, mapped)
		}
	}
	for _, err := range []error{stateErr("42703"), stateErr("08006"), errors.New("relation does not exist")} {
		if mapped := pgsql.Err(bg, "claim", err); strings.Contains(mapped.Error(), "pgstore.Migrate") {
			t.Errorf("Err(%v) = %v; the hint belongs to 42P01 alone", err, mapped)
		}
	}
	db, _ := testenv.Postgres(t)
	_, err := db.ExecContext(bg, `SELECT * FROM idemguard_keys`)
	if mapped := pgsql.Err(bg, "get", err); !strings.Contains(mapped.Error(), pgsql.MigrateHint) {
		t.Errorf("a real server's missing table: Err = %v; want the hint", mapped)
	}
}

// TestUnavailableWithoutSQLState: failures that carry no SQLSTATE (the
// connection is gone, the network failed, the deadline passed) are
// unavailable too; a plain error is not; a cancelled call is returned as
// it is.
func TestUnavailableWithoutSQLState(t *testing.T) {
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	for name, tc := range map[string]struct {
		err  error
		want bool
	}{
		"bad conn":  {driver.ErrBadConn, true},
		"conn done": {fmt.Errorf("exec: %w", sql.ErrConnDone), true},
		"EOF":       {io.EOF, true},
		"short":     {io.ErrUnexpectedEOF, true},
		"net":       {fmt.Errorf("dial: %w", opErr), true},
		"deadline":  {context.DeadlineExceeded, true},
		"plain":     {errors.New("syntax error"), false},
		"no rows":   {sql.ErrNoRows, false},
	} {
		if got := pgsql.Unavailable(tc.err); got != tc.want {
			t.Errorf("%s: Unavailable(%v) = %v, want %v", name, tc.err, got, tc.want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := pgsql.Err(ctx, "lookup", context.Canceled); err != context.Canceled {
		t.Errorf("Err of a cancelled call = %v, want context.Canceled itself", err)
	}
	if err := pgsql.Err(context.Background(), "lookup", nil); err != nil {
		t.Errorf("Err(nil) = %v", err)
	}
}

// TestBadConnAfterContextEndedIsTheContexts: lib/pq, when a statement's
// context ends, sends PostgreSQL a cancel request and returns its answer
// (57014), or, when the cancellation races with the connection, a bad
// connection (driver.ErrBadConn, which a driver returns only when the
// statement was not run): either is the context's end, as a call that
// never began (make test once saw TestCommitContextEndsMidStatement's
// cancelled Commit answer "store unavailable: driver: bad connection").
// With the context alive, a bad connection stays unavailable. So is the
// sql.ErrTxDone a Commit answers after database/sql rolled back a
// transaction whose context ended (a claim cancelled between its UPDATE
// and its COMMIT answered a plain store error; found by review).
func TestBadConnAfterContextEndedIsTheContexts(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	badConn, txDone := fmt.Errorf("exec: %w", driver.ErrBadConn), sql.ErrTxDone
	for name, tc := range map[string]struct {
		ctx  context.Context
		err  error
		want error
		not  error
	}{
		"cancelled":         {cancelled, badConn, context.Canceled, guard.ErrUnavailable},
		"deadline":          {expired, badConn, context.DeadlineExceeded, nil},
		"alive":             {context.Background(), badConn, guard.ErrUnavailable, context.Canceled},
		"cancelled tx done": {cancelled, txDone, context.Canceled, guard.ErrUnavailable},
		"deadline tx done":  {expired, txDone, context.DeadlineExceeded, nil},
	} {
		err := pgsql.Err(tc.ctx, "commit", tc.err)
		if !errors.Is(err, tc.want) || (tc.not != nil && errors.Is(err, tc.not)) {
			t.Errorf("%s: Err = %v; want %v, not %v", name, err, tc.want, tc.not)
		}
		if strings.HasPrefix(name, "deadline") && !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("%s: Err = %v; want guard.ErrUnavailable too", name, err)
		}
	}
}

// TestTerminatedBackendIsUnavailable: a real server error through lib/pq.
// The backend of a connection is terminated by an administrator
// (pg_terminate_backend, SQLSTATE 57P01 on that connection); the next
// statement on it fails, and the failure is classified as unavailable.
func TestTerminatedBackendIsUnavailable(t *testing.T) {
	db, _ := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var pid int
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var killed bool
	if err := db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("pg_terminate_backend = %v, %v", killed, err)
	}
	_, err = conn.ExecContext(ctx, `SELECT 1`)
	if err == nil {
		t.Fatal("a statement on a terminated backend succeeded")
	}
	code, _ := pgsql.SQLState(err)
	t.Logf("lib/pq after pg_terminate_backend: %T %v (SQLSTATE %q)", err, err, code)
	if mapped := pgsql.Err(ctx, "exec", err); !errors.Is(mapped, guard.ErrUnavailable) {
		t.Fatalf("Err = %v, want guard.ErrUnavailable", mapped)
	}
}

// TestServerSQLStateThroughLibPQ: errors raised by a real server with a
// given SQLSTATE reach the classification through lib/pq's *pq.Error and
// its SQLState method.
func TestServerSQLStateThroughLibPQ(t *testing.T) {
	db, _ := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for code, want := range map[string]bool{"40001": true, "40P01": true, "57P03": true, "53300": true, "23505": false, "P0001": false} {
		_, err := db.ExecContext(ctx, `DO $$ BEGIN RAISE EXCEPTION 'raised' USING ERRCODE = '`+code+`'; END $$`)
		if got, _ := pgsql.SQLState(err); got != code {
			t.Fatalf("raised %s, SQLState = %q (%T %v)", code, got, err, err)
		}
		if got := errors.Is(pgsql.Err(ctx, "exec", err), guard.ErrUnavailable); got != want {
			t.Errorf("SQLSTATE %s: unavailable = %v, want %v", code, got, want)
		}
	}
}

// TestServerTimeoutsAreUnavailable: a statement the server cancels under
// its own statement_timeout, and one that gives up on a lock another
// transaction holds (lock_timeout), are unavailable with the caller's
// context alive: they did not apply and may later, so a guard answers
// 503 with Retry-After, not a plain failure.
func TestServerTimeoutsAreUnavailable(t *testing.T) {
	db, _ := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SET LOCAL statement_timeout = '20ms'`); err != nil {
		t.Fatal(err)
	}
	_, err = tx.ExecContext(ctx, `SELECT pg_sleep(5)`)
	if got, _ := pgsql.SQLState(err); got != "57014" {
		t.Fatalf("statement_timeout: SQLState %q (%v)", got, err)
	}
	if mapped := pgsql.Err(ctx, "exec", err); !errors.Is(mapped, guard.ErrUnavailable) || ctx.Err() != nil {
		t.Errorf("statement_timeout: Err = %v, want guard.ErrUnavailable with ctx alive", mapped)
	}

	table := "lock_timeout_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (id int PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
	holder, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()
	if _, err := holder.ExecContext(ctx, `LOCK TABLE `+table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	waiter, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Rollback()
	if _, err := waiter.ExecContext(ctx, `SET LOCAL lock_timeout = '20ms'`); err != nil {
		t.Fatal(err)
	}
	_, err = waiter.ExecContext(ctx, `INSERT INTO `+table+` VALUES (1)`)
	if got, _ := pgsql.SQLState(err); got != "55P03" {
		t.Fatalf("lock_timeout: SQLState %q (%v)", got, err)
	}
	if mapped := pgsql.Err(ctx, "exec", err); !errors.Is(mapped, guard.ErrUnavailable) {
		t.Errorf("lock_timeout: Err = %v, want guard.ErrUnavailable", mapped)
	}
}
