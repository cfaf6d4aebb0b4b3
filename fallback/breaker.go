package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/idemguard/idemguard/guard"
)

// State is the state of a Store's circuit breaker.
type State uint8

// Breaker states. The zero value is StateClosed.
const (
	// StateClosed: the primary is called.
	StateClosed State = iota
	// StateHalfOpen: Options.OpenTimeout has passed since the breaker
	// opened; Options.HalfOpenProbes claims are let through to find out
	// whether the primary is back.
	StateHalfOpen
	// StateOpen: the primary is not called for claims and reads; claims
	// follow the Policy. Holders' writes still reach it (see Store).
	StateOpen
)

var stateNames = [...]string{"closed", "half-open", "open"}

// String returns "closed", "half-open" or "open" ("unknown" for another
// value).
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// ErrBreakerOpen is wrapped, beside guard.ErrUnavailable, in the error of
// a call the breaker kept from the primary: the breaker was open, or
// half-open with its probes under way and no verdict within
// Options.Timeout. The primary was not called.
var ErrBreakerOpen = errors.New("fallback: breaker open, primary not called")

// errProbing is allow's answer while the half-open breaker's probes are
// under way.
var errProbing = fmt.Errorf("%w (half-open, probes under way)", ErrBreakerOpen)

// breaker is the circuit breaker in front of the primary: gobreaker's
// two-step breaker, with gobreaker's types kept inside this file.
type breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]

	mu      sync.Mutex
	changes chan struct{} // closed and replaced on every state change

	// cause is the text of the last failure reported, which the warning
	// that the breaker opened names: over backstop.Wrap it may be
	// PostgreSQL's, not Redis's.
	cause atomic.Pointer[string]

	// probeAt (unix ns) is when the breaker, last opened, lets a probe
	// through: set when it opens, a little after gobreaker set its own
	// expiry, so never sooner than that.
	probeAt atomic.Int64
}

func fromGobreaker(s gobreaker.State) State {
	switch s {
	case gobreaker.StateHalfOpen:
		return StateHalfOpen
	case gobreaker.StateOpen:
		return StateOpen
	}
	return StateClosed
}

// newBreaker builds the breaker opts describe (opts has its defaults).
func newBreaker(opts Options) *breaker {
	b := &breaker{changes: make(chan struct{})}
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        opts.Name,
		MaxRequests: opts.HalfOpenProbes,
		Timeout:     opts.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= opts.FailuresToOpen },
		IsExcluded:  func(err error) bool { return errors.Is(err, errExcluded) },
		OnStateChange: func(name string, gfrom, gto gobreaker.State) {
			from, to := fromGobreaker(gfrom), fromGobreaker(gto)
			b.wake()
			if to == StateOpen {
				b.probeAt.Store(time.Now().Add(opts.OpenTimeout).UnixNano())
				cause := ""
				if c := b.cause.Load(); c != nil {
					cause = *c
				}
				opts.Logger.Warn("idemguard: primary store unavailable, breaker open",
					"breaker", name, "from", from.String(), "policy", opts.Policy.String(), "retry_in", opts.OpenTimeout,
					"cause", cause)
			} else {
				opts.Logger.Info("idemguard: primary store breaker changed state",
					"breaker", name, "from", from.String(), "to", to.String())
			}
			if opts.OnStateChange != nil {
				opts.OnStateChange(from, to)
			}
		},
	})
	return b
}

// allow asks the breaker for a call to the primary. If it is let through,
// done must be called with the call's outcome (see report). Otherwise err
// wraps ErrBreakerOpen: it is errProbing while the half-open breaker's
// probes are under way.
func (b *breaker) allow() (done func(error), err error) {
	done, err = b.cb.Allow()
	switch {
	case err == nil:
		return done, nil
	case errors.Is(err, gobreaker.ErrTooManyRequests):
		return nil, errProbing
	default:
		return nil, ErrBreakerOpen
	}
}

// state returns the breaker's state.
func (b *breaker) state() State { return fromGobreaker(b.cb.State()) }

// openUntil returns when the open breaker lets a probe through, and
// false when it is not open.
func (b *breaker) openUntil() (time.Time, bool) {
	// The state is read first: OnStateChange stored probeAt, under
	// gobreaker's lock, before State could report the breaker open.
	if b.state() != StateOpen {
		return time.Time{}, false
	}
	return time.Unix(0, b.probeAt.Load()), true
}

// wake closes the channel changed returned, as a state change does.
func (b *breaker) wake() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.changes)
	b.changes = make(chan struct{})
}

// changed returns a channel closed at the breaker's next state change
// (or wake).
func (b *breaker) changed() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.changes
}

// errPanicked is what the breaker hears of a primary call that panicked.
var errPanicked = errors.New("fallback: primary store panicked")

// reportPanic, deferred around a primary call, counts a panic as a failure
// (as gobreaker's Execute does), so a panicking probe cannot leave the
// breaker half-open with its probe slot taken. The panic goes on.
func reportPanic(done func(error)) {
	if p := recover(); p != nil {
		done(errPanicked)
		panic(p)
	}
}

// errExcluded marks a call the caller abandoned: it says nothing about the
// primary.
var errExcluded = errors.New("fallback: call abandoned by its caller")

// report tells the breaker b how a primary call went: only
// unavailability is a failure (its text kept as the breaker's cause); the
// store's other answers are successes.
func (b *breaker) report(ctx context.Context, done func(error), err error) {
	switch {
	case err == nil:
		done(nil)
	case ctx.Err() != nil:
		done(errExcluded)
		// An abandoned probe frees its half-open slot without a change
		// of state: the claims waiting for one wake to take it, instead
		// of being refused at their Timeout with nothing probing.
		b.wake()
	case isOutage(err):
		c := err.Error()
		b.cause.Store(&c)
		done(err)
	default:
		done(nil)
	}
}

// isOutage reports whether err says the store could not be reached.
func isOutage(err error) bool {
	return errors.Is(err, guard.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}
