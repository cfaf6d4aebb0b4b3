package guard

import (
	"context"
	"time"
)

// Store keeps idempotency records. Every method is atomic for one key, and
// every write is a compare-and-set on the owner token: a caller that does
// not hold the key changes nothing and gets ErrLeaseLost. Every method is
// safe to repeat with the same arguments (a retried request gets the same
// answer). A store that cannot be reached returns an error wrapping
// ErrUnavailable. A claim of a key Key.Validate refuses is refused with
// its error (ErrInvalidKey); a lease or retention (ttl, d, ClaimRequest's
// Lease and TTL) that is not positive, or a negative MaxAttempts, is
// refused with an error; such a call changes nothing.
//
// The package storetest holds the contract suite every Store passes.
type Store interface {
	// Claim takes the key for req.Token, or reports why it cannot: a
	// replay of the stored result, another holder in progress, a
	// fingerprint mismatch, or exhausted attempts. These outcomes are
	// reported in Outcome.Status, not as errors.
	Claim(ctx context.Context, req ClaimRequest) (Outcome, error)
	// Complete stores result for the holder of lease (lease.Key,
	// lease.Token) and keeps the record for ttl.
	Complete(ctx context.Context, lease Lease, result []byte, ttl time.Duration) error
	// Fail marks the holder's attempt as failed with reason; the key may be
	// claimed again until its attempts run out. The record is kept for ttl.
	Fail(ctx context.Context, lease Lease, reason string, ttl time.Duration) error
	// Release undoes the holder's claim as if it had never been made.
	// Releasing a key that is already gone succeeds.
	Release(ctx context.Context, lease Lease) error
	// Extend keeps the holder's lease alive for d from now.
	Extend(ctx context.Context, lease Lease, d time.Duration) error
	// Get reads the record, or returns ErrNotFound.
	Get(ctx context.Context, key Key) (Record, error)
}

// ClaimRequest is what Store.Claim needs.
type ClaimRequest struct {
	Key         Key
	Token       string        // the claimant's owner token, unique per claim
	Fingerprint string        // a digest of the request; a different one is a mismatch
	Lease       time.Duration // how long the claim lives without an Extend
	TTL         time.Duration // how long a record is kept
	MaxAttempts int           // attempts before ErrExhausted; 0 means no limit
}

// Status is the kind of answer to a claim.
type Status uint8

// Claim outcomes.
const (
	Acquired   Status = iota + 1 // the caller holds the key and must run the effect
	InProgress                   // another holder's lease is alive
	Replay                       // the key completed; Outcome.Result holds its result
	Mismatch                     // the key was used with another fingerprint
	Exhausted                    // the key failed MaxAttempts times
)

var statusNames = [...]string{"", "acquired", "in_progress", "replay", "mismatch", "exhausted"}

func (s Status) String() string {
	if int(s) < len(statusNames) && s != 0 {
		return statusNames[s]
	}
	return "unknown"
}

// Outcome is the answer to a claim.
type Outcome struct {
	Status    Status
	Lease     Lease         // when Acquired: the holder's lease
	Result    []byte        // when Replay: the stored result
	LeaseLeft time.Duration // when InProgress: time until the holder's lease ends
	Attempts  int           // when Exhausted: attempts made
	LastError string        // when Exhausted: the last failure's reason
	// Steps: when Acquired from a StepStore, the steps the record holds,
	// in order (see StepStore); nil when none.
	Steps []StepResult
}

// Lease is a held claim on a key. Downstream writes that must not happen
// twice should carry Fence: it grows with every acquisition of the key,
// a claim after a released first attempt included (the released holder
// ran, and a write of its may still be on its way), while the store keeps
// the key's record. Where that ends (docs/design.md, rule 4): a record
// that expired, a released first attempt's marker once it is gone (a
// minute on a RedisStore), and a Redis failover or restart that lost the
// last writes start lower again; pgstore's Store and backstop.Wrap, whose
// rows outlive the record, keep numbering.
//
// A Store's writes take the Lease its Claim returned; a Lease built by
// hand from Key and Token alone is accepted too.
type Lease struct {
	Key       Key
	Token     string // the owner token every write is compared against
	Fence     int64  // grows with every acquisition of the key while the store keeps its record (see Lease)
	Attempt   int    // 1 for the first acquisition
	Recovered bool   // a previous holder's lease ran out before it finished

	// Deadline is when the holder must be done unless the lease is
	// extended: when the claim was sent, plus the lease, minus
	// LeaseMargin (see the package doc). Guard.Claim and Guard.Do set it;
	// a Store leaves it zero. No other claim can succeed before it, as
	// long as the client's and the server's clocks drift apart by less
	// than the margin. KeepAlive and Do extend the lease and cancel the
	// effect's context at the deadline in force; the Lease value keeps
	// the first one.
	Deadline time.Time

	// steps is the holder's step log (Step), shared by the copies of a
	// Lease that Guard.Do or Guard.Claim handed out; nil in a Lease a
	// Store returned or one built by hand. A pointer keeps Lease
	// comparable.
	steps *stepLog

	// names caches the issuing store's Redis name for Key, so the
	// holder's later writes need not derive it again. It is a comparable
	// value: two answers to the same claim are equal Leases (until the
	// holder records a step, which changes the record the claim left).
	names leaseNames
}

// State is where a record stands in its life.
type State uint8

// Record states.
const (
	StatePending   State = iota + 1 // claimed, effect running
	StateCompleted                  // result stored
	StateFailed                     // last attempt failed; claimable again
)

var stateNames = [...]string{"", "pending", "completed", "failed"}

func (s State) String() string {
	if int(s) < len(stateNames) && s != 0 {
		return stateNames[s]
	}
	return "unknown"
}

// ParseState reads a state name as String writes it.
func ParseState(s string) (State, bool) {
	for i, n := range stateNames {
		if n == s && i != 0 {
			return State(i), true
		}
	}
	return 0, false
}

// Record is a stored key as Get reads it.
type Record struct {
	Key         Key
	State       State
	Fingerprint string
	Token       string
	Fence       int64
	Attempt     int
	Recovered   bool
	Result      []byte
	LastError   string
	LeaseLeft   time.Duration // zero when no lease is alive
	TTL         time.Duration // time until the record expires; zero if unknown
	Steps       []StepResult  // steps recorded by a StepStore, in order (pending and failed records)
}
