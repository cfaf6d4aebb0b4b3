package sqlbackstop

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/guard"
)

// Sentinel errors. Check them with errors.Is; the typed errors carry more.
var (
	// ErrAlreadyCommitted: the key's effect was committed before. The
	// error is an *AlreadyCommittedError with the stored result; roll the
	// transaction back and return that result.
	ErrAlreadyCommitted = errors.New("sqlbackstop: key already committed")
	// ErrStaleFence: the caller's fence is lower than one the backstop has
	// already seen for the key (a later holder took it over). The error is
	// a *StaleFenceError; roll the transaction back.
	ErrStaleFence = errors.New("sqlbackstop: stale fence")
)

// AlreadyCommittedError is returned by Commit when the key's row exists
// and is committed. It matches ErrAlreadyCommitted.
type AlreadyCommittedError struct {
	Key    guard.Key
	Result []byte // the result stored by the commit that won
	Fence  int64  // the fence that commit carried
}

func (e *AlreadyCommittedError) Error() string {
	return fmt.Sprintf("%s: %s (fence %d)", ErrAlreadyCommitted, e.Key, e.Fence)
}

// Is makes errors.Is(err, ErrAlreadyCommitted) true.
func (e *AlreadyCommittedError) Is(target error) bool { return target == ErrAlreadyCommitted }

// StaleFenceError is returned by Commit when a later holder of the key is
// known to the backstop. It matches ErrStaleFence.
type StaleFenceError struct {
	Key   guard.Key
	Fence int64 // the caller's fence
	Seen  int64 // the fence the backstop recorded for the key
}

func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("%s: %s fence %d, backstop has seen fence %d", ErrStaleFence, e.Key, e.Fence, e.Seen)
}

// Is makes errors.Is(err, ErrStaleFence) true.
func (e *StaleFenceError) Is(target error) bool { return target == ErrStaleFence }

// dbErr maps a database error to the guard's vocabulary: a connection
// that failed, a server shutting down or out of resources wraps
// guard.ErrUnavailable; a cancelled context is returned as it is; anything
// else is wrapped plainly.
func dbErr(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err
	}
	if unavailable(err) {
		return fmt.Errorf("%w: postgres %s: %w", guard.ErrUnavailable, what, err)
	}
	return fmt.Errorf("postgres %s: %w", what, err)
}

func unavailable(err error) bool {
	var pe *pq.Error
	if errors.As(err, &pe) {
		code := string(pe.Code)
		return strings.HasPrefix(code, "08") || // connection exception
			strings.HasPrefix(code, "53") || // insufficient resources
			strings.HasPrefix(code, "57P") || // admin/crash shutdown, cannot connect now
			code == "40001" || code == "40P01" // serialization failure, deadlock: try again
	}
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne)
}
