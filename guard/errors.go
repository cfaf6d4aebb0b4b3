package guard

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Check them with errors.Is; the typed errors below carry
// more and match their sentinel too.
var (
	// ErrInProgress: another holder has the key and its lease is alive.
	// The error is an *InProgressError saying how long the lease has left.
	ErrInProgress = errors.New("idemguard: request in progress")
	// ErrMismatch: the key was used before with a different fingerprint.
	ErrMismatch = errors.New("idemguard: key reused with a different request")
	// ErrLeaseLost: the caller no longer holds the key, or can no longer
	// be sure it does: its lease ran out (by the client's reckoning, see
	// the package doc) or another holder took over, or the record is gone.
	// A write through the guard that returns it was not kept. An effect's
	// context is cancelled with a cause matching it.
	ErrLeaseLost = errors.New("idemguard: lease lost")
	// ErrMaxRun: the effect ran for Options.MaxRun; its context was
	// cancelled with a cause matching both ErrMaxRun and ErrLeaseLost, the
	// lease is no longer extended, and the key can be recovered by another
	// claim once the lease runs out.
	ErrMaxRun = errors.New("idemguard: maximum run time reached")
	// ErrExhausted: the key failed MaxAttempts times and is not run again.
	// The error is an *ExhaustedError with the last failure.
	ErrExhausted = errors.New("idemguard: attempts exhausted")
	// ErrUnavailable: the store could not be reached or did not answer, so
	// the call's outcome in it is unknown; retry later. From a claim,
	// nothing ran. From the write that ends a run (Do, DoBatch, Complete)
	// the effect did run (Do's Result carries its Lease): its result may
	// not be stored, and the key then runs again once its lease runs out.
	ErrUnavailable = errors.New("idemguard: store unavailable")
	// ErrInvalidKey: the key cannot be stored (empty, too long, control
	// characters).
	ErrInvalidKey = errors.New("idemguard: invalid key")
	// ErrNotFound: Get found no record for the key.
	ErrNotFound = errors.New("idemguard: no record")
	// ErrRejected: returned by a Func (wrapped, with errors.Is) to say it
	// refused the work before any effect, e.g. a lock it needed was taken.
	// Do then releases the key, as if never claimed, instead of recording
	// a failed attempt.
	ErrRejected = errors.New("idemguard: rejected before any effect")
	// ErrCorrupt: the store holds a record this version cannot read.
	ErrCorrupt = errors.New("idemguard: corrupt record")
	// ErrEviction: the Redis server may evict keys under memory pressure,
	// which would forget records and leases and let an effect run twice.
	// RedisStore.Check returns it as an *EvictionError naming the server
	// and its maxmemory-policy.
	ErrEviction = errors.New("idemguard: redis may evict keys")
)

// InProgressError is returned when another holder has the key.
type InProgressError struct {
	Key        Key
	RetryAfter time.Duration // time left on the holder's lease
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%s: %s (lease ends in %s)", ErrInProgress, e.Key, e.RetryAfter)
}

// Is makes errors.Is(err, ErrInProgress) true.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// ExhaustedError is returned when a key has failed its last allowed attempt.
type ExhaustedError struct {
	Key       Key
	Attempts  int
	LastError string // what the last failed attempt reported
}

func (e *ExhaustedError) Error() string {
	return fmt.Sprintf("%s: %s after %d attempts: %s", ErrExhausted, e.Key, e.Attempts, e.LastError)
}

// Is makes errors.Is(err, ErrExhausted) true.
func (e *ExhaustedError) Is(target error) bool { return target == ErrExhausted }

// EvictionError is returned by RedisStore.Check for a server whose
// maxmemory-policy is not noeviction.
type EvictionError struct {
	Addr   string // the server (a Cluster master, a Ring shard), as its client names it
	Policy string // its maxmemory-policy, e.g. "allkeys-lru"
}

func (e *EvictionError) Error() string {
	return fmt.Sprintf("%s: %s has maxmemory-policy %s, which can evict idempotency records and leases "+
		"(an effect would run twice); set maxmemory-policy noeviction, or CheckOptions.AcceptEviction to accept the risk",
		ErrEviction, e.Addr, e.Policy)
}

// Is makes errors.Is(err, ErrEviction) true.
func (e *EvictionError) Is(target error) bool { return target == ErrEviction }
