package occ

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/idemguard/idemguard/internal/sqlstate"
)

// Querier is what the writes run their statements on: *sql.DB, *sql.Tx
// and *sql.Conn all satisfy it, whatever the driver (lib/pq, pgx's stdlib).
// Pass a *sql.Tx to make a write part of a larger transaction. Every
// statement runs through q's own methods, so a type of the application's
// (one embedding *sql.Tx, as sqlx.Tx does, or a pool that runs statements
// on a transaction the context carries) is used as it routes them. The
// one exception is a *sql.DB itself, from which VersionedTable.Update
// takes a connection of its own, on which a statement is never sent twice.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ Querier = (*sql.DB)(nil)
	_ Querier = (*sql.Tx)(nil)
	_ Querier = (*sql.Conn)(nil)
)

// VersionedTable names a table of the application's whose rows carry an
// integer version column, for single-version optimistic concurrency: an
// update names the version it read and applies only if the row is still
// at it. occ creates no table: the application adds the column, e.g. with
// the SQL of Migration.
type VersionedTable struct {
	Schema        string // "" for the connection's search_path
	Name          string // the table; required
	IDColumn      string // the key column; default "id"
	VersionColumn string // an integer column; default "version"
}

func (v VersionedTable) names() (table, idCol, verCol string, err error) {
	table, err = tableName("VersionedTable", v.Schema, v.Name)
	if err != nil {
		return "", "", "", err
	}
	idCol, verCol = orDefault(v.IDColumn, "id"), orDefault(v.VersionColumn, "version")
	if err := checkNames("VersionedTable", idCol, verCol); err != nil {
		return "", "", "", err
	}
	return table, idCol, verCol, nil
}

// Update sets the columns in set on the row id, if it is still at version,
// and bumps the version:
//
//	UPDATE table SET col = $3, …, version = version + 1 WHERE id = $1 AND version = $2
//
// It returns the new version. When no row matched (another writer moved
// the version on, or the row is gone) it returns an error matching
// ErrConflict and changes nothing. Column names are quoted; values are
// parameters. Database errors are classified as dbErr says (ErrConflict
// for a serialization failure, ErrUnavailable for a lost connection). An
// id that database/sql sends as NULL (nil, a nil pointer, an invalid
// sql.Null…) names no row: it is refused with an error, not a conflict
// that UpdateRetry would try again.
//
// An update whose reply was lost answers ErrUnavailable, not a conflict
// (so UpdateRetry does not apply it again), and whether it was applied is
// the caller's to find out. On a *sql.DB (a connection of its own), a
// *sql.Tx or a *sql.Conn it is never sent again. The price, on a *sql.DB:
// the first update on a pooled connection the server has closed while
// it sat idle (a restart, a failover, idle_session_timeout) answers
// ErrUnavailable too, though nothing was sent to a live server; lib/pq
// reports the two alike. Keep the pool's connections younger than the
// server's idle limit (sql.DB.SetConnMaxIdleTime), or, to have such an
// update sent again where that is safe to tell, pass the *sql.DB through a
// Querier of your own (above). Through another Querier
// whose statements reach a pool (an application's type embedding
// *sql.DB, as sqlx.DB does), database/sql may send it again on another
// connection, where it matches no row, the version having moved on by
// this very update (or, queued behind that first send under REPEATABLE
// READ or SERIALIZABLE, fails with a serialization failure): Update sees
// the arguments converted again for the repeat, and answers
// ErrUnavailable then too, whatever error the repeat met. (A driver whose
// QueryContext declines has them converted twice for one send: through
// such a Querier its conflicts read as ErrUnavailable too; on a *sql.DB,
// *sql.Tx or *sql.Conn they are conflicts.)
//
// A version tells the states of a row apart only while the row lives: a
// row deleted and inserted again under the same id starts again at the
// column's default (1), so a version read before the delete matches the
// new row once it is at that number again, and an update computed from
// the old row applies to the new one, whose changes it overwrites (JPA's
// @Version and Rails' lock_version behave the same). Do not reuse the id
// of a deleted row; or delete by marking the row (a column set through
// Update); or insert the new row at a version above the old row's last.
func (v VersionedTable) Update(ctx context.Context, q Querier, id any, version int64, set map[string]any) (int64, error) {
	table, idCol, verCol, err := v.names()
	if err != nil {
		return 0, err
	}
	if q == nil {
		return 0, errors.New("occ: Update: nil Querier")
	}
	if err := checkID("Update", v.Name, id); err != nil {
		return 0, err
	}
	if len(set) == 0 {
		return 0, errors.New("occ: Update with no columns to set")
	}
	cols := make([]string, 0, len(set))
	for c := range set {
		switch {
		case c == "" || strings.ContainsRune(c, 0):
			return 0, fmt.Errorf("occ: Update: bad column name %q", c)
		case c == idCol || c == verCol:
			return 0, fmt.Errorf("occ: Update may not set %q: it is the id or version column", c)
		}
		cols = append(cols, c)
	}
	if db, ok := q.(*sql.DB); ok {
		// On a connection of its own, so that database/sql never sends
		// the statement again: it does, on another connection, when the
		// driver reports the first one bad after sending it (lib/pq
		// does when the reply is lost), and the repeat, finding the
		// version moved on by this very update, would read as a conflict.
		// Only a *sql.DB itself: another type's methods may route the
		// statement elsewhere (to the context's transaction), and
		// bypassing them would take the update out of that transaction.
		c, err := db.Conn(ctx)
		if err != nil {
			return 0, dbErr(ctx, "versioned update", err)
		}
		defer func() { _ = c.Close() }()
		q = c
	}
	sort.Strings(cols) // one statement text per column set
	var sb strings.Builder
	sent := &sendCount{v: version} // counts the sends through other Queriers
	args := []any{id, sent}
	sb.WriteString("UPDATE " + table + " SET ")
	for _, c := range cols {
		args = append(args, set[c])
		fmt.Fprintf(&sb, "%s = $%d, ", quoteIdent(c), len(args))
	}
	qv, qi := quoteIdent(verCol), quoteIdent(idCol)
	fmt.Fprintf(&sb, "%s = %s + 1 WHERE %s = $1 AND %s = $2 RETURNING %s", qv, qv, qi, qv, qv)
	var next int64
	err = q.QueryRowContext(ctx, sb.String(), args...).Scan(&next)
	if err != nil {
		if n := sent.n.Load(); n > 1 && !oneConn(q) {
			return 0, sentAgain(ctx, fmt.Sprintf("versioned update of %s %s=%v", v.Name, idCol, id), n, err)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return 0, fmt.Errorf("%w: %s %s=%v is no longer at version %d", ErrConflict, v.Name, idCol, id, version)
		}
		return 0, dbErr(ctx, "versioned update", err)
	}
	return next, nil
}

// sentAgain is the error of a write (what) that database/sql sent n > 1
// times, the last send failing with err: whatever the repeat met (no row,
// the version having moved on by an earlier send; a serialization failure
// or deadlock while it queued behind that send, under REPEATABLE READ or
// SERIALIZABLE), an earlier send may have applied the write, so the error
// matches ErrUnavailable and never ErrConflict. A context error stays
// matchable; a conflict is kept as text only.
func sentAgain(ctx context.Context, what string, n int32, err error) error {
	what = fmt.Sprintf("%s sent %d times: an earlier send, whose reply was lost, may have applied it", what, n)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: %s", ErrUnavailable, what)
	}
	if err = dbErr(ctx, "write", err); IsConflict(err) || errors.Is(err, ErrUnavailable) {
		return fmt.Errorf("%w: %s (the last: %v)", ErrUnavailable, what, err)
	}
	return fmt.Errorf("%w: %s (the last: %w)", ErrUnavailable, what, err)
}

// oneConn reports whether q is a *sql.Conn or a *sql.Tx: database/sql
// never sends their statements again (only a *sql.DB's, on another
// connection), so more than one conversion of an argument (a driver whose
// QueryContext declines makes database/sql prepare the statement and
// convert the arguments again) is not a repeat there.
func oneConn(q Querier) bool {
	switch q.(type) {
	case *sql.Conn, *sql.Tx:
		return true
	}
	return false
}

// sendCount is an argument of a write (Update's version, Write's base
// vector). database/sql converts a statement's arguments (calling Value)
// once for each time it sends the statement, so more than one call means
// the write was sent again after the driver reported its connection bad,
// possibly after PostgreSQL had applied it; or, with a driver whose
// QueryContext declines, that database/sql prepared the statement and
// converted them again (see oneConn).
type sendCount struct {
	v driver.Value
	n atomic.Int32
}

// Value returns the version, and counts the call.
func (s *sendCount) Value() (driver.Value, error) {
	s.n.Add(1)
	return s.v, nil
}

// UpdateRetry is Update inside RetryOnConflict: before every try it calls
// read, which must read the row afresh and return the version it read and
// the values to set from what it read. It returns the new version, or the
// last conflict when the tries run out.
//
// After a serialization failure or deadlock (SQLSTATE 40001, 40P01), from
// read or from the update, UpdateRetry asks q whether its transaction is
// still usable, by sending it a statement that does nothing. When
// PostgreSQL answers that the transaction is aborted (SQLSTATE 25P02), as
// it always does for a transaction that met such a failure, nothing more
// can run in it: the failure is returned at once, matching ErrConflict,
// and the caller runs its whole transaction again. The answer is q's,
// whatever q's type: a *sql.Tx, a type embedding one (sqlx.Tx), or a
// pool that runs statements on the context's transaction. A conflict that
// leaves the transaction usable (the row moved on under READ COMMITTED,
// or read's failure came from another transaction) is tried again.
func (v VersionedTable) UpdateRetry(ctx context.Context, q Querier, id any, opts RetryOptions,
	read func(ctx context.Context) (version int64, set map[string]any, err error)) (int64, error) {
	if read == nil {
		return 0, errors.New("occ: UpdateRetry: nil read func")
	}
	var aborted error // the serialization failure that ended q's transaction
	var next int64
	err := RetryOnConflict(ctx, opts, func(ctx context.Context) error {
		version, set, err := read(ctx)
		if err == nil {
			next, err = v.Update(ctx, q, id, version, set)
		}
		if sqlstate.Retryable(err) && txAborted(ctx, q) {
			aborted = err
			return errTxAborted // not a conflict: ends the loop
		}
		return err
	})
	if aborted != nil {
		if !errors.Is(aborted, ErrConflict) { // read's own error, as the driver gave it
			aborted = fmt.Errorf("%w: transaction aborted: %w", ErrConflict, aborted)
		}
		return 0, aborted
	}
	return next, err
}

// errTxAborted ends UpdateRetry's loop on a transaction PostgreSQL aborted.
var errTxAborted = errors.New("occ: transaction aborted")

// txAborted reports whether q's statements run in a transaction
// PostgreSQL has aborted: it refuses every statement but a ROLLBACK (of
// the transaction or to a savepoint) with SQLSTATE 25P02,
// in_failed_sql_transaction. Any other
// answer (success, a lost connection) is not taken for an abort.
func txAborted(ctx context.Context, q Querier) bool {
	_, err := q.ExecContext(ctx, `SELECT 1`)
	code, _ := sqlstate.Code(err)
	return code == inFailedSQLTransaction
}

// inFailedSQLTransaction is PostgreSQL's SQLSTATE for a statement sent in
// a transaction that an earlier error aborted.
const inFailedSQLTransaction = "25P02"

// Migration returns the SQL that adds the version column to the table
// (Up: bigint NOT NULL DEFAULT 1, so existing rows start at version 1, as
// does every row inserted without one: see Update for an id deleted and
// inserted again) and drops it (Down), for the application's own
// migration tool.
func (v VersionedTable) Migration() (Migration, error) {
	table, _, verCol, err := v.names()
	if err != nil {
		return Migration{}, err
	}
	return renderMigration("version_column", map[string]string{"Table": table, "Column": quoteIdent(verCol)})
}

// RetryOptions shape RetryOnConflict's backoff. The zero value is ready to
// use.
type RetryOptions struct {
	// MaxTries bounds the tries, the first included. Default 10.
	MaxTries uint
	// InitialInterval is the first wait (at most MaxInterval). Default 5ms.
	InitialInterval time.Duration
	// MaxInterval caps one wait, jitter included. Default 1s.
	MaxInterval time.Duration
	// Multiplier grows the wait after each conflict. Default 2 (also for
	// a value below 1, or NaN).
	Multiplier float64
	// Jitter spreads each wait uniformly by ± this fraction, so writers
	// that conflicted together do not retry together; at MaxInterval, by
	// this fraction below it. Default 0.5 (also for NaN); a negative value
	// means none; a value above 1 counts as 1, so no wait is below 0.
	Jitter float64
}

// backOff is the waits between tries of o (with its defaults).
func (o RetryOptions) backOff() backoff.BackOff {
	return &cappedBackOff{&backoff.ExponentialBackOff{
		InitialInterval:     o.InitialInterval,
		RandomizationFactor: o.Jitter,
		Multiplier:          o.Multiplier,
		MaxInterval:         o.MaxInterval,
	}}
}

// cappedBackOff keeps every wait of an ExponentialBackOff within its
// MaxInterval, which caps the interval before the jitter spreads it: a
// wait drawn above the cap is reflected below it, so waits at the cap are
// spread uniformly over [(1-Jitter)·MaxInterval, MaxInterval].
type cappedBackOff struct{ *backoff.ExponentialBackOff }

func (c *cappedBackOff) NextBackOff() time.Duration {
	d, limit := c.ExponentialBackOff.NextBackOff(), c.MaxInterval
	if d > limit {
		d = max(2*limit-d, 0)
	}
	return d
}

func (o RetryOptions) withDefaults() RetryOptions {
	if o.MaxTries == 0 {
		o.MaxTries = 10
	}
	if o.InitialInterval <= 0 {
		o.InitialInterval = 5 * time.Millisecond
	}
	if o.MaxInterval <= 0 {
		o.MaxInterval = time.Second
	}
	o.InitialInterval = min(o.InitialInterval, o.MaxInterval) // no wait is above it
	if !(o.Multiplier >= 1) {                                 // NaN too: it would make every wait -2^63ns
		o.Multiplier = 2
	}
	switch {
	case o.Jitter == 0 || math.IsNaN(o.Jitter):
		o.Jitter = 0.5
	case o.Jitter < 0:
		o.Jitter = 0
	case o.Jitter > 1: // a wider spread reaches below 0: no wait at all
		o.Jitter = 1
	}
	return o
}

// RetryOnConflict calls try until it does not fail with a conflict, with
// exponential backoff and jitter between tries, at most MaxTries times. A
// conflict is an error matching ErrConflict, or one whose chain holds a
// PostgreSQL serialization failure or deadlock (SQLSTATE 40001, 40P01) from
// any driver whose errors have a SQLState method (lib/pq, pgx): try may
// run a SERIALIZABLE transaction of its own and return its commit error.
// try must read the row afresh each time and update from what it read:
//
//	err := occ.RetryOnConflict(ctx, occ.RetryOptions{}, func(ctx context.Context) error {
//		n, ver, err := readCounter(ctx, db, id)            // re-read before each try
//		if err != nil {
//			return err
//		}
//		_, err = counters.Update(ctx, db, id, ver, map[string]any{"n": n + 1})
//		return err
//	})
//
// Any other error ends the loop and is returned as it is; so is the last
// conflict when the tries run out, and the context's error when it ends
// (with its cause, if it was cancelled with one: context.WithCancelCause).
func RetryOnConflict(ctx context.Context, opts RetryOptions, try func(ctx context.Context) error) error {
	if try == nil {
		return errors.New("occ: RetryOnConflict: nil func")
	}
	o := opts.withDefaults()
	b := o.backOff()
	var tries uint
	conflict := false // the last try ended in a conflict
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		if ctx.Err() != nil {
			return struct{}{}, backoff.Permanent(ctxErr(ctx))
		}
		tries++
		err := try(ctx)
		conflict = err != nil && IsConflict(err)
		if err != nil && !conflict {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, err
	}, backoff.WithBackOff(b), backoff.WithMaxTries(o.MaxTries), backoff.WithMaxElapsedTime(0))
	if pe, ok := err.(*backoff.PermanentError); ok {
		return pe.Unwrap() // Retry keeps its wrapper on the last try
	}
	if conflict && tries < o.MaxTries && ctx.Err() != nil {
		// Retry ended on the context, and gives its cause alone. (Told
		// apart without ==: a cause may be of an uncomparable type.)
		return ctxErr(ctx)
	}
	return err
}

// ctxErr is the error of ctx, which has ended: ctx.Err(), with the cause
// beside it if it was cancelled with one.
func ctxErr(ctx context.Context) error {
	cerr, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cerr, cause) && errors.Is(cause, cerr) { // not ==: see RetryOnConflict
		return cerr
	}
	return fmt.Errorf("%w: %w", cerr, cause)
}

// IsConflict reports whether RetryOnConflict would try again after err:
// err matches ErrConflict, or holds a PostgreSQL serialization failure or
// deadlock (SQLSTATE 40001, 40P01) from any driver.
func IsConflict(err error) bool {
	return errors.Is(err, ErrConflict) || sqlstate.Retryable(err)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// checkID refuses an id that database/sql would send as SQL NULL (nil, a
// nil pointer, a Valuer answering nil): it names no row, and on a UNIQUE
// (not PRIMARY KEY) id column, whose NULLs PostgreSQL takes as distinct,
// each vector write of it would insert one more row nobody can read.
func checkID(what, table string, id any) error {
	v, err := driver.DefaultParameterConverter.ConvertValue(id)
	if b, ok := v.([]byte); err == nil && (v == nil || ok && b == nil) { // a nil []byte goes as NULL too
		return fmt.Errorf("occ: %s of %s: the id %#v is SQL NULL, which names no row", what, table, id)
	}
	return nil
}

// quoteIdent quotes a PostgreSQL identifier, as pq.QuoteIdentifier and
// pgx.Identifier.Sanitize do; names holding NUL are refused before.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func tableName(what, schema, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("occ: %s without a Name", what)
	}
	if err := checkNames(what, schema, name); err != nil {
		return "", err
	}
	t := quoteIdent(name)
	if schema != "" {
		t = quoteIdent(schema) + "." + t
	}
	return t, nil
}

func checkNames(what string, names ...string) error {
	for _, s := range names {
		if strings.ContainsRune(s, 0) {
			return fmt.Errorf("occ: %s names must not contain NUL bytes", what)
		}
	}
	return nil
}
