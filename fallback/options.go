package fallback

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// Policy says what a Store does with a claim while its primary is
// unavailable (the breaker is open, or the primary's answer did not come).
type Policy uint8

// Policies.
const (
	// FailClosed refuses the claim with an error wrapping
	// guard.ErrUnavailable: no effect runs. httpx answers it with 503 and
	// Retry-After. The default.
	FailClosed Policy = iota
	// Secondary claims the key in Options.Secondary (the Postgres Store)
	// while the breaker is open. A claim whose own primary call fails is
	// refused with ErrUnavailable, not retried in the secondary: the
	// primary may have taken it before its answer was lost. Keys held or
	// completed in the secondary are honoured when the primary returns,
	// whichever process wrote them (see Store): every claim the primary
	// grants costs a read of the secondary.
	Secondary
	// FailOpen lets the effect run unguarded: Claim answers Acquired with a
	// lease that is recorded nowhere (Fence 0, see Unguarded), and the
	// holder's Complete, Fail, Release and Extend succeed without writing.
	// Duplicates are not stopped by the store; an effect that commits its
	// row with package backstop (Backstop.Func, Commit) is still kept
	// single by that row, which takes the unguarded lease only where no
	// holder's row stands. Every claim let through is logged at warning
	// level. Choose it only where a duplicate costs less than a
	// refusal. Over backstop.Wrap, PostgreSQL is part of the primary: its
	// outage opens the breaker as Redis's does, and effects then run
	// unguarded though Redis is up (kept single by their commit).
	FailOpen
)

var policyNames = [...]string{"fail-closed", "secondary", "fail-open"}

// String returns the policy's name: "fail-closed", "secondary" or
// "fail-open" ("unknown" for another value).
func (p Policy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return "unknown"
}

// Defaults for Options.
const (
	DefaultTimeout          = time.Second         // bound on one primary call
	DefaultSecondaryTimeout = 2 * time.Second     // bound on one secondary call
	DefaultFailuresToOpen   = 5                   // consecutive unavailability errors that open the breaker
	DefaultOpenTimeout      = 5 * time.Second     // how long the breaker stays open before a probe
	DefaultHalfOpenProbes   = 1                   // claims let through while half-open
	DefaultName             = "idemguard-primary" // the breaker's name in logs
)

// Options configure a Store. The zero value is ready to use: fail closed,
// with the defaults above.
type Options struct {
	// Policy is what happens to a claim while the primary is unavailable.
	// Default FailClosed.
	Policy Policy
	// Secondary is the store claims go to under the Secondary policy,
	// typically pgstore.New. Required for Secondary, ignored
	// otherwise.
	Secondary guard.Store
	// Timeout bounds every call to the primary: a primary that does not
	// answer costs a call at most this long, and the call counts as a
	// failure of the primary. It holds even for a go-redis client without
	// ContextTimeoutEnabled. Default DefaultTimeout (1s).
	Timeout time.Duration
	// SecondaryTimeout bounds every call to the secondary. Default
	// DefaultSecondaryTimeout (2s).
	SecondaryTimeout time.Duration
	// FailuresToOpen is how many consecutive primary calls must fail with
	// unavailability (guard.ErrUnavailable or a timeout) to open the
	// breaker. Answers such as ErrLeaseLost or ErrNotFound are successes of
	// the store. A holder's Extend is not counted (guard retries a failing
	// one ever sooner: one holder's trouble is not an outage). Default
	// DefaultFailuresToOpen (5).
	FailuresToOpen uint32
	// OpenTimeout is how long the open breaker makes no claim or read
	// call to the primary (holders' writes still go) before it lets probe
	// claims through (half-open). Default DefaultOpenTimeout (5s).
	OpenTimeout time.Duration
	// HalfOpenProbes is how many claims (and reads) the half-open breaker lets through
	// to the primary; that many successes in a row close it, one failure
	// opens it again. Other claims meanwhile wait for the probes' verdict,
	// at most Timeout, then go where it sends them (or are refused with
	// ErrUnavailable); they are never sent to the secondary while a probe
	// runs (see Store). Holders' writes and Get are not limited. Default
	// DefaultHalfOpenProbes (1).
	HalfOpenProbes uint32
	// Name names the breaker in logs. Default DefaultName.
	Name string
	// Logger receives the breaker's state changes (the warning that it
	// opened names the last failure, "cause": over backstop.Wrap it may be
	// PostgreSQL's) and, under FailOpen, a warning for every claim let
	// through unguarded. Default
	// slog.Default().
	Logger *slog.Logger
	// OnStateChange, if set, is called on every change of the breaker's
	// state (for metrics). It runs under the breaker's lock: it must be
	// quick and must not call the Store.
	OnStateChange func(from, to State)
}

// validate reports options New cannot work with. They come from
// configuration (a config file's policy name), so they are errors, not
// panics.
func (o Options) validate() error {
	if o.Policy > FailOpen {
		return fmt.Errorf("fallback: unknown Policy %d (want FailClosed, Secondary or FailOpen)", o.Policy)
	}
	if o.Policy == Secondary && o.Secondary == nil {
		return errors.New("fallback: Policy Secondary needs Options.Secondary")
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.SecondaryTimeout <= 0 {
		o.SecondaryTimeout = DefaultSecondaryTimeout
	}
	if o.FailuresToOpen == 0 {
		o.FailuresToOpen = DefaultFailuresToOpen
	}
	if o.OpenTimeout <= 0 {
		o.OpenTimeout = DefaultOpenTimeout
	}
	if o.HalfOpenProbes == 0 {
		o.HalfOpenProbes = DefaultHalfOpenProbes
	}
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}
