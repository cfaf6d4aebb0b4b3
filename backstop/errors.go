package backstop

import (
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
)

// Sentinel errors. Check them with errors.Is; the typed errors carry more.
var (
	// ErrAlreadyCommitted: the key's effect was committed before. The
	// error is an *AlreadyCommittedError with the stored result; roll the
	// transaction back and return that result.
	ErrAlreadyCommitted = errors.New("backstop: key already committed")
	// ErrStaleFence: the caller's fence is lower than one the backstop has
	// already seen for the key (a later holder took it over). The error is
	// a *StaleFenceError; roll the transaction back.
	ErrStaleFence = errors.New("backstop: stale fence")
)

// AlreadyCommittedError is returned by Commit when the key's row exists
// and is committed. It matches ErrAlreadyCommitted.
type AlreadyCommittedError struct {
	Key    guard.Key
	Result []byte // the result stored by the commit that won
	Fence  int64  // the fence that commit carried
}

// Error names the key and the fence that committed it (never the result).
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

// Error names the key, the caller's fence and the one the backstop saw.
func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("%s: %s fence %d, backstop has seen fence %d", ErrStaleFence, e.Key, e.Fence, e.Seen)
}

// Is makes errors.Is(err, ErrStaleFence) true.
func (e *StaleFenceError) Is(target error) bool { return target == ErrStaleFence }

// dbErr maps a database error to the guard's vocabulary (internal/pgsql):
// unreachable, shutting down, out of resources, serialization failure or
// deadlock wrap guard.ErrUnavailable, whatever the driver.
var dbErr = pgsql.Err

// Shorthands for the shared SQL fragments (internal/pgsql).
const (
	clockNow    = pgsql.ClockNow
	keysColumns = pgsql.KeysColumns
)

var dur = pgsql.Dur
