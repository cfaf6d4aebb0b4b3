package occ

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/internal/sqlstate"
)

// Sentinel errors, for branching with errors.Is. The data of a refused
// vector write is in a *VectorConflictError (errors.As).
var (
	// ErrConflict: the write was refused, and changed nothing, because the
	// row is no longer at the version (or vector) the write was based on.
	// Re-read and try again (RetryOnConflict), or merge the values a
	// *VectorConflictError carries. It also matches a serialization
	// failure or deadlock reported by PostgreSQL (SQLSTATE 40001, 40P01):
	// the transaction must then be retried from its start.
	ErrConflict = errors.New("occ: conflict")
	// ErrConcurrent: a vector write was refused because the stored vector
	// and the write's are concurrent: neither descends from the other, so
	// the two values are siblings that the application merges. It comes
	// as a *VectorConflictError, which also matches ErrConflict.
	ErrConcurrent = errors.New("occ: concurrent versions")
	// ErrNotFound: VectorTable.Read found no row with the id. To create
	// one, write with the empty vector as the base.
	ErrNotFound = errors.New("occ: no such row")
	// ErrUnavailable: the database could not be reached, or is shutting
	// down or out of resources (SQLSTATE classes 08, 53, 57P, or a broken
	// connection). When the connection broke after the statement was sent,
	// the write may have happened: sending the same write again (same
	// base, same value) is safe, as it is then refused with ErrConflict
	// (or, for a vector write, answered as done); re-reading and applying
	// a change again may apply it twice.
	ErrUnavailable = errors.New("occ: database unavailable")
)

// VectorConflictError is returned by VectorTable.Write when the stored
// vector is not Before-or-Equal the write's base. It carries both versions,
// so the application can merge them (Dynamo's siblings): write the merged
// value with MergedBase as the base. It matches ErrConflict, and
// ErrConcurrent when Order is Concurrent.
type VectorConflictError struct {
	Table  string // the table, as named in the VectorTable
	ID     any    // the row's id
	Writer string // the writer whose write was refused

	Base  Vector // the vector the refused write was based on
	Value []byte // the value it would have written

	Stored      Vector // the vector the row holds
	StoredValue []byte // the value the row holds

	// Order is Stored compared with Base.Increment(Writer), the vector the
	// write would have had. Concurrent is the usual case: another writer
	// wrote something this writer had not seen. Any other order (Equal,
	// After, Before) means the row holds a write of this same writer that
	// Base lacks: two processes share a writer id, or an earlier write of
	// this one (an earlier try with another value, say) already landed.
	Order Ordering
}

// MergedBase is the base to write the merged value with: the least upper
// bound of Stored and Base. A write on it succeeds unless the row moved on
// again meanwhile.
func (e *VectorConflictError) MergedBase() Vector { return e.Stored.Merge(e.Base) }

// Error names the row, the writer and both vectors (not the values, which
// may be large or private).
func (e *VectorConflictError) Error() string {
	return fmt.Sprintf("%s: %s id=%v: %s write on [%s] refused, row is at [%s] (%s)",
		ErrConflict, e.Table, e.ID, e.Writer, e.Base, e.Stored, e.Order)
}

// Is makes errors.Is(err, ErrConflict) true, and errors.Is(err,
// ErrConcurrent) when Order is Concurrent.
func (e *VectorConflictError) Is(target error) bool {
	return target == ErrConflict || target == ErrConcurrent && e.Order == Concurrent
}

// dbErr classifies a database error: a serialization failure or deadlock
// matches ErrConflict; a connection that failed or a server shutting down
// or out of resources matches ErrUnavailable; a context error is kept
// (errors.Is(err, context.Canceled) still holds), and so is the context's
// when the driver reports a statement it cancelled for it (lib/pq gives
// PostgreSQL's 57014, query_canceled, or a bad connection when the
// cancellation races with it; the error matches both); anything else is
// wrapped as it is.
func dbErr(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("occ: %s: %w", what, err)
		}
		// lib/pq answers a statement whose context ended with the cancel
		// request's answer (57014) or, when the cancellation races with
		// the connection, a bad connection: either is the context's end.
		if code, _ := sqlstate.Code(err); code == queryCanceled || errors.Is(err, driver.ErrBadConn) {
			return fmt.Errorf("occ: %s: %w: %w", what, cerr, err)
		}
	}
	switch {
	case sqlstate.Retryable(err):
		return fmt.Errorf("%w: %s: %w", ErrConflict, what, err)
	case sqlstate.Unreachable(err):
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
	}
	return fmt.Errorf("occ: %s: %w", what, err)
}

// queryCanceled is PostgreSQL's SQLSTATE for a statement cancelled at a
// client's request (or by statement_timeout).
const queryCanceled = "57014"
