package pgsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/sqlstate"
)

// SQLState returns the SQLSTATE code of the first error in err's chain
// that carries one, and whether there was one.
func SQLState(err error) (string, bool) { return sqlstate.Code(err) }

// MigrateHint is what Err adds to the message of a table that does not
// exist (SQLSTATE 42P01): the tables are made by migrations, not on first
// use.
const MigrateHint = "no such table: create the tables with pgstore.Migrate or the command idemguard migrate up, " +
	"given the same Schema and TablePrefix"

// Err maps a database error to the guard's vocabulary: a connection that
// failed, a server shutting down or out of resources, a serialization
// failure or a deadlock wraps guard.ErrUnavailable (the call may be made
// again); a cancelled context is returned as it is; anything else is
// wrapped plainly, a missing table (42P01, not unavailable: no retry
// makes it) with MigrateHint. what names the operation in the message.
//
// A statement the driver cancelled because ctx ended (lib/pq sends
// PostgreSQL a cancel request and returns its answer, SQLSTATE 57014
// query_canceled, or, when the cancellation races with the connection,
// driver.ErrBadConn) is reported as ctx's end: a deadline as
// guard.ErrUnavailable, a cancellation as context.Canceled. The statement
// may have applied all the same (lib/pq returns driver.ErrBadConn for a
// connection that broke after the statement went out, and keeps it in
// the chain: the guard releases such a claim by its token).
// A 57014 with ctx alive (the server's statement_timeout, or an operator's
// pg_cancel_backend) and a 55P03 (lock_timeout, NOWAIT: a lock another
// transaction holds) wrap guard.ErrUnavailable: the statement did not
// apply, and may when the load or the lock has passed. So does a write
// refused by a read-only transaction (25006: a primary demoted to a hot
// standby in a failover, a role or session whose transactions are read
// only): it may apply once the connections reach the new primary; and
// so does a transaction a server in recovery refused to begin (BeginTx).
func Err(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	// database/sql rolls a transaction back when its context ends, and
	// its Commit then answers sql.ErrTxDone: the context's end too.
	if code, _ := SQLState(err); ctx.Err() != nil && (code == "57014" || errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrTxDone)) {
		err = fmt.Errorf("%w (%v)", ctx.Err(), err) // the context's end, not the server's refusal, decides
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err
	}
	if Unavailable(err) {
		return fmt.Errorf("%w: postgres %s: %w", guard.ErrUnavailable, what, err)
	}
	if sqlstate.UndefinedTable(err) {
		return fmt.Errorf("postgres %s: %w (%s)", what, err, MigrateHint)
	}
	return fmt.Errorf("postgres %s: %w", what, err)
}

// Unavailable reports whether err means the database could not do the
// work now but may later: SQLSTATE class 08 (connection exception), 53
// (insufficient resources), 57P (admin or crash shutdown, cannot connect
// now), 40001 (serialization failure), 40P01 (deadlock), 57014 (statement
// cancelled: statement_timeout), 55P03 (lock_not_available:
// lock_timeout) and 25006 (read_only_sql_transaction: a write on a hot
// standby or in a read-only transaction); a transaction a server in
// recovery refused to begin (BeginTx's error); a bad or done connection,
// an EOF, a deadline or a network error. A bare 0A000
// (feature_not_supported) is not: it says so only of a server in
// recovery, which BeginTx asks.
func Unavailable(err error) bool {
	if code, _ := SQLState(err); code == "57014" || code == "55P03" || code == "25006" {
		return true
	}
	var rec *recoveryError
	if errors.As(err, &rec) {
		return true
	}
	return sqlstate.Unreachable(err) || sqlstate.Retryable(err)
}

// ReadOnly reports whether err is a write the database refused because
// it takes no writes now: a read-only transaction's refusal (25006) or a
// transaction a server in recovery refused to begin (BeginTx). Reads may
// still be answered.
func ReadOnly(err error) bool {
	var rec *recoveryError
	code, _ := SQLState(err)
	return code == "25006" || errors.As(err, &rec)
}

// BeginTx begins a transaction on db as db.BeginTx does, and tells a
// server in recovery apart. lib/pq begins every transaction READ WRITE
// (READ ONLY when asked), whatever the session's default, and a server in
// recovery (a hot standby: a primary demoted in a failover, a replica the
// connections reached) refuses that with SQLSTATE 0A000,
// feature_not_supported ("cannot set transaction read-write mode during
// recovery"), where a write it refuses is 25006. 0A000 is no "retry
// later" in general, so on it BeginTx asks the server whether it is in
// recovery (pg_is_in_recovery(), bounded by recoveryCheckTimeout) and, if
// it is, returns the refusal as an error Unavailable reports (Err wraps
// it in guard.ErrUnavailable), the driver's error still in its chain. Any
// other error is the driver's, for Err.
func BeginTx(ctx context.Context, db *sql.DB, opts *sql.TxOptions) (*sql.Tx, error) {
	tx, err := db.BeginTx(ctx, opts)
	if code, _ := SQLState(err); code != "0A000" {
		return tx, err
	}
	rctx, cancel := context.WithTimeout(ctx, recoveryCheckTimeout)
	defer cancel()
	var recovering bool
	if qerr := db.QueryRowContext(rctx, `SELECT pg_is_in_recovery()`).Scan(&recovering); qerr != nil || !recovering {
		return nil, err
	}
	return nil, &recoveryError{err: err}
}

// recoveryCheckTimeout bounds BeginTx's question whether the server is in
// recovery.
const recoveryCheckTimeout = time.Second

// recoveryError is a transaction a server in recovery refused to begin.
type recoveryError struct{ err error }

func (e *recoveryError) Error() string {
	return "the server is in recovery (a hot standby): " + e.err.Error()
}

func (e *recoveryError) Unwrap() error { return e.err }
