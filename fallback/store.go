package fallback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// Store is a guard.Store that stays safe while its primary is unavailable.
// Every call to the primary passes a circuit breaker and is bounded by
// Options.Timeout; once the breaker is open, the primary is not called for
// claims and reads until Options.OpenTimeout has passed. A holder's
// Complete, Fail, Release, Extend or SaveStep of a lease the primary
// issued still goes to the primary, uncounted: the breaker opens on a
// stall the primary may be over, and that write taken nowhere would leave
// the claim pending for its lease, its effect run again by the retry that
// recovers it. Only unavailability
// (guard.ErrUnavailable, a timeout) counts against the primary. See the
// package documentation for what happens while it is down and when it
// returns. A Store is a guard.StepStore that keeps steps when the stores
// it writes them to do (KeepsSteps), and is safe for concurrent use.
type Store struct {
	primary   guard.Store
	secondary guard.Store // nil unless the policy is Secondary
	opts      Options
	cb        *breaker
	inline    bool // the primary ends its calls by their context's deadline itself

	// gate orders claims sent to the secondary before switch-back checks.
	gate gate
	// consultUntil (unix ns): until then, a primary acquisition the
	// secondary cannot be asked about is refused.
	consultUntil atomic.Int64
	// uncheckedUntil (unix ns): a check outside the consult window went
	// unanswered; until then acquisitions outside it are not checked.
	uncheckedUntil atomic.Int64
	// owners remembers the leases held in the secondary.
	owners owners
	// secondaryTTL is the longest TTL a claim in the secondary asked for:
	// an extension there keeps that record for it after the new lease's
	// end, and the switch-back checks must last as long.
	secondaryTTL atomic.Int64
}

var _ guard.StepStore = (*Store)(nil)

// New returns a Store over primary, configured by opts (see Options; the
// zero value fails closed). It returns an error, and no Store, for options
// that cannot work: a nil primary, an unknown Policy, or the Secondary
// policy without Options.Secondary.
//
// The primary is used only through guard.Store, guard.StepStore (for
// SaveStep, and guard.KeepsSteps) and the optional guard.DeadlineStore: a
// wrapper around a RedisStore keeps every path as long as it forwards
// those.
func New(primary guard.Store, opts Options) (*Store, error) {
	if primary == nil {
		return nil, errors.New("fallback.New: nil primary Store")
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	s := &Store{primary: primary, opts: opts, inline: honoursDeadline(primary)}
	if opts.Policy == Secondary {
		s.secondary = opts.Secondary
	}
	s.cb = newBreaker(opts)
	return s, nil
}

// State returns the breaker's state: closed (the primary is used), open
// (it is not called), half-open (probes are let through).
func (s *Store) State() State { return s.cb.state() }

// ProbeAt returns, while the breaker is open, when it will let its first
// probe through to the primary (Options.OpenTimeout after it opened,
// never sooner), and true. Until then claims and reads follow the
// Policy without calling the primary: under FailClosed, what a 503's
// Retry-After should say. Closed or half-open, it returns the zero Time
// and false.
func (s *Store) ProbeAt() (time.Time, bool) { return s.cb.openUntil() }

// Claim implements guard.Store. With the breaker closed it claims in the
// primary (each acquisition checked against a secondary); with it open it
// follows the Policy. A claim refused because the breaker kept it from the
// primary gets an error wrapping guard.ErrUnavailable and ErrBreakerOpen.
func (s *Store) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if strings.HasPrefix(req.Token, openPrefix) {
		return guard.Outcome{}, fmt.Errorf("%w: %q", ErrReservedToken, openPrefix)
	}
	var probeWait <-chan time.Time
	for {
		changed := s.cb.changed()
		s.gate.enter()
		done, err := s.cb.allow()
		if err == nil {
			s.gate.leave()
			return s.claimPrimary(ctx, req, done)
		}
		if !errors.Is(err, errProbing) {
			defer s.gate.leave()
			return s.whileDown(ctx, req, err)
		}
		s.gate.leave()
		// Half-open: a probe is finding out whether the primary is back.
		// Wait for its verdict (at most Timeout) rather than send this
		// claim to the secondary, where it could race the probe's
		// switch-back check for the same key.
		if probeWait == nil {
			t := time.NewTimer(s.opts.Timeout)
			defer t.Stop()
			probeWait = t.C
		}
		select {
		case <-changed:
		case <-probeWait:
			return guard.Outcome{}, fmt.Errorf("%w: fallback: primary store is being probed: %w", guard.ErrUnavailable, err)
		case <-ctx.Done():
			return guard.Outcome{}, context.Cause(ctx)
		}
	}
}

// whileDown answers a claim the breaker kept from the primary.
func (s *Store) whileDown(ctx context.Context, req guard.ClaimRequest, cause error) (guard.Outcome, error) {
	switch s.opts.Policy {
	case Secondary:
		return s.claimSecondary(ctx, req)
	case FailOpen:
		return s.open(ctx, req, cause)
	default:
		return guard.Outcome{}, fmt.Errorf("%w: fallback: primary store: %w", guard.ErrUnavailable, cause)
	}
}

// Complete implements guard.Store; it writes to the store that issued the
// lease. An unguarded lease's Complete succeeds and stores nothing.
func (s *Store) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, to target) error {
		if to != toPrimary {
			s.wroteSecondary(ttl)
		}
		return st.Complete(ctx, lease, result, ttl)
	})
}

// Fail implements guard.Store; it writes to the store that issued the lease.
func (s *Store) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, to target) error {
		if to != toPrimary {
			s.wroteSecondary(ttl)
		}
		return st.Fail(ctx, lease, reason, ttl)
	})
}

// Release implements guard.Store; it writes to the store that issued the
// lease.
func (s *Store) Release(ctx context.Context, lease guard.Lease) error {
	primary := false // the release went to the primary (and only there)
	err := s.write(ctx, lease, func(ctx context.Context, st guard.Store, to target) error {
		primary = to == toPrimary
		err := st.Release(ctx, lease)
		if to != toPrimary && err == nil {
			s.owners.drop(lease.Key, lease.Token)
		}
		return err
	})
	if err == nil && primary && s.consulting() && ctx.Err() == nil && !strings.HasPrefix(lease.Token, openPrefix) {
		// The primary answers a release of a key it does not hold with
		// nil, so a lease the secondary issued that this Store does not
		// remember (another process's before a restart, or a claim whose
		// answer was lost, released by its token) was never looked for
		// there: its record stayed pending for the whole lease. The
		// token is unique: releasing where it holds the key is safe. Only
		// a live lease is such a record: a pending one without a lease is
		// the mark of a primary wrapped by backstop.Wrap on the
		// secondary's tables, whose lease Wrap's Release has just ended
		// and which it keeps on purpose when the primary kept the key (a
		// step's effect happened): released here, it expired, and once
		// the primary lost the key another payload could take it.
		if rec, gerr := s.getSecondary(ctx, lease.Key); gerr == nil && rec.Token == lease.Token && rec.State == guard.StatePending && rec.LeaseLeft > 0 {
			_, rerr := call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (struct{}, error) {
				return struct{}{}, s.secondary.Release(ctx, lease)
			}, nil)
			if rerr != nil {
				return fmt.Errorf("fallback: secondary: %w", rerr)
			}
		}
	}
	return err
}

// Extend implements guard.Store; it writes to the store that issued the
// lease.
//
// A failed extension does not count against the breaker: guard's
// keepalive tries a failing extension again ever sooner as its deadline
// nears, so one holder's trouble (backstop.Wrap's mark of one row that a
// transaction keeps locked) would be a run of failures that opened the
// breaker for every key. Claims, reads and the other writes find an
// outage.
func (s *Store) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	return s.writeUncounted(ctx, lease, func(ctx context.Context, st guard.Store, to target) error {
		if to != toPrimary {
			// The record lives on for the lease and the TTL after it: a
			// holder that runs past its claim's window keeps the key
			// after a switch-back.
			s.wroteSecondary(satAdd(d, time.Duration(s.secondaryTTL.Load())))
		}
		err := st.Extend(ctx, lease, d)
		if to == toOwner && err == nil {
			// Not for a write the secondary took for a moment (see
			// writeTo): the primary's lease would run out under its
			// holder, and its steps land where the primary's recovery
			// does not look.
			s.owners.hold(lease.Key, lease.Token, d)
		}
		return err
	})
}

// SaveStep implements guard.StepStore: it records the step in the store
// that issued the lease, as the other writes of a holder go, and keeps a
// holder's steps in one store: one the secondary took while the breaker
// was open makes it the lease's store from then on (as an Extend there
// does), and one the primary did not answer while the breaker stayed
// closed is refused with an error matching guard.ErrUnavailable (it may
// or may not be recorded in the primary), not written to the secondary
// for a moment. A claim the primary grants after a switch-back is told
// the steps its key's record in the secondary kept. An unguarded
// (FailOpen) lease records nothing and succeeds, as its other writes do.
// A step for a lease whose store keeps no steps (not a guard.StepStore)
// gets an error matching guard.ErrStepsUnsupported; the RedisStore and
// pgstore's Store keep steps. A wrapped primary keeps its steps only if
// the wrapper is a guard.StepStore too. guard.Step asks KeepsSteps first,
// so over such a store its step does not run.
func (s *Store) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, to target) error {
		ss, ok := st.(guard.StepStore)
		if !ok {
			return fmt.Errorf("fallback: %w (%T)", guard.ErrStepsUnsupported, st)
		}
		if to == toStandIn {
			// A one-off: the holder's next step goes to the primary,
			// which would lack this one (ErrStepOrder), and so would a
			// recovery there. Unanswered, the step may or may not be
			// recorded in the primary: say so.
			return fmt.Errorf("%w: fallback: the primary did not answer the step", guard.ErrUnavailable)
		}
		err := ss.SaveStep(ctx, lease, index, step)
		if to == toOwner && err == nil {
			// The step is the secondary's now: so are the holder's
			// later steps and writes (its steps kept in one place), as
			// after an Extend there.
			s.owners.hold(lease.Key, lease.Token, 0)
		}
		return err
	})
}

// KeepsSteps reports whether the steps SaveStep takes are kept: whether
// the primary keeps steps (guard.KeepsSteps: a guard.StepStore, or a
// wrapper of one that forwards it), and the secondary too under the
// Secondary policy. guard.Step asks it before a step runs: with false it
// answers guard.ErrStepsUnsupported without running the step, where the
// step would otherwise run in every attempt, its result kept nowhere. An
// unguarded (FailOpen) lease's steps are never kept, as none of its
// writes is; that does not change the answer.
func (s *Store) KeepsSteps() bool {
	return guard.KeepsSteps(s.primary) && (s.secondary == nil || guard.KeepsSteps(s.secondary))
}

// target is where writeTo sends a holder's write.
type target uint8

const (
	toPrimary target = iota
	toOwner          // the secondary, which issued the lease
	toStandIn        // the secondary, for a moment: its record bears the lease's token
)

// write sends a holder's write to the store that issued its lease.
func (s *Store) write(ctx context.Context, lease guard.Lease, op func(context.Context, guard.Store, target) error) error {
	return s.writeTo(ctx, lease, true, op)
}

// writeUncounted is write, the primary's answer not counted by the
// breaker.
func (s *Store) writeUncounted(ctx context.Context, lease guard.Lease, op func(context.Context, guard.Store, target) error) error {
	return s.writeTo(ctx, lease, false, op)
}

// writeTo is write; counted says whether the breaker counts the
// primary's answer while it is closed.
func (s *Store) writeTo(ctx context.Context, lease guard.Lease, counted bool, op func(context.Context, guard.Store, target) error) error {
	key, token := lease.Key, lease.Token
	if strings.HasPrefix(token, openPrefix) {
		return nil // unguarded: nothing was recorded, nothing to write
	}
	onSecondary := func(to target) error {
		_, err := call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, op(ctx, s.secondary, to)
		}, nil)
		return err
	}
	if s.secondary != nil && s.owners.has(key, token) {
		if err := onSecondary(toOwner); err != nil {
			return fmt.Errorf("fallback: secondary: %w", err)
		}
		return nil
	}
	err := s.holderWrite(ctx, counted, func(ctx context.Context) error { return op(ctx, s.primary, toPrimary) })
	if err == nil {
		return nil
	}
	if s.secondary != nil && ((s.consulting() && errors.Is(err, guard.ErrLeaseLost)) || isOutage(err)) && ctx.Err() == nil {
		// Perhaps a lease taken in the secondary so long ago that this
		// Store forgot it: write there if the secondary's record is owned
		// by this token (Release of an absent key would succeed anywhere).
		// Or, while the primary is out, a lease of a primary wrapped by
		// backstop.Wrap on the secondary's tables: the holder's mark is
		// the secondary's record, and bears its token. Its Fail or
		// Release must end the mark's lease there, or every claim in the
		// secondary is told the key is in progress until the lease would
		// have ended; its Complete stores the result the primary could
		// not take, which the key then replays.
		rec, gerr := s.getSecondary(ctx, key)
		if gerr == nil && rec.Token == token {
			// The secondary owns the lease from now on when the primary
			// does not know it (a lease it issued, forgotten here), or
			// when the primary is out (the breaker not closed: its
			// holder's next writes go there at once, not after a bound
			// spent on the primary each). A write it took for a moment
			// (one call unanswered, the breaker closed) is a one-off: the
			// primary keeps the lease, its extensions and its steps.
			to := toStandIn
			if errors.Is(err, guard.ErrLeaseLost) || s.cb.state() != StateClosed {
				to = toOwner
			}
			if serr := onSecondary(to); serr != nil {
				return fmt.Errorf("fallback: secondary: %w", serr)
			}
			return nil
		}
	}
	if isOutage(err) {
		return fmt.Errorf("fallback: primary: %w", err)
	}
	return err
}

// Get implements guard.Store. It reads the primary; the secondary when the
// primary is unavailable under the Secondary policy, or when the primary
// has no record before ConsultUntil.
func (s *Store) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	var rec guard.Record
	err := s.primaryWrite(ctx, func(ctx context.Context) error {
		var err error
		rec, err = s.primary.Get(ctx, key)
		return err
	})
	if err == nil {
		return rec, nil
	}
	if s.secondary != nil && ctx.Err() == nil &&
		(isOutage(err) || errors.Is(err, guard.ErrNotFound) && s.consulting()) {
		rec, serr := s.getSecondary(ctx, key)
		if serr != nil && !errors.Is(serr, guard.ErrNotFound) {
			return guard.Record{}, fmt.Errorf("fallback: secondary: %w", serr)
		}
		return rec, serr
	}
	if isOutage(err) {
		return guard.Record{}, fmt.Errorf("fallback: primary: %w", err)
	}
	return guard.Record{}, err
}
