// Package fallback keeps a guard safe when its Redis store goes away.
//
// A Store wraps the primary guard.Store (Redis) in a circuit breaker
// (github.com/sony/gobreaker/v2) and bounds every call to it by a timeout.
// While the primary is unavailable, claims follow a Policy: FailClosed (the
// default) refuses them with guard.ErrUnavailable, Secondary claims them in
// another Store (the Postgres Store of package sqlbackstop), FailOpen lets
// the effect run unguarded and logs a warning for each.
//
// # Switching back
//
// A key claimed or completed in the secondary during an outage is not run
// again through the primary when it returns. Three rules make it so:
//
//  1. A lease belongs to the store that issued it. The Store remembers the
//     tokens of leases it took in the secondary, and their holder's
//     Complete, Fail, Release and Extend go there, whatever the breaker
//     says later. A holder that claimed in the secondary and finishes after
//     the switch-back completes in the secondary.
//  2. For as long as a record written to the secondary may live (its TTL,
//     counted from the last write this Store made there; see ConsultUntil),
//     every claim the primary answers with Acquired is checked against the
//     secondary before it is returned. If the secondary has no record, the
//     primary's lease stands. If it holds the key completed, the result is
//     copied into the primary under the lease just taken (so later retries
//     replay from Redis) and the claim answers Replay. If it holds the key
//     with another fingerprint, the claim answers Mismatch. If it holds it
//     pending or failed, the primary's claim is released and the claim is
//     made in the secondary, whose own atomic claim answers: InProgress for
//     a live holder, a recovery (fence+1) for an abandoned one, Exhausted.
//     If the secondary cannot be read, the claim is released and refused
//     with ErrUnavailable: an unknown answer never runs the effect.
//  3. Claims are sent to the secondary only while the breaker is open, and
//     the check of rule 2 first waits for every secondary claim already
//     sent to finish. So a check cannot read the secondary before a claim
//     that was routed there earlier has been written. While the breaker is
//     half-open, claims beyond its probes wait for the probes' verdict (at
//     most Options.Timeout, then ErrUnavailable) instead of going to the
//     secondary, where they could race a probe's check.
//
// What a fallback cannot do, and the SQL backstop (a unique row written in
// the business transaction) must: a key completed in Redis before the
// outage is unknown to the secondary, so a retry during the outage runs it
// there again; a holder that claimed in Redis and is still running when
// Redis dies cannot stop a retry from claiming in the secondary; a Redis
// that comes back empty has forgotten what it held. The two stores number
// fences separately, so a key's fence can go down when it moves between
// them; Backstop.Commit's unique row, not fence order, keeps the effect
// single across an outage. The switch-back check lives in this process:
// another process that never used the secondary does not check it (call
// ConsultSecondary at start-up to make it check).
//
// Every primary call runs on a goroutine of its own so that the bound holds
// whatever the client does with the context; a call abandoned at its bound
// finishes in the background.
package fallback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

	"github.com/idemguard/idemguard/guard"
)

// ErrReservedToken is returned by Claim for an owner token that begins
// with the prefix this package gives unguarded leases. Tokens made by
// guard.Guard never do.
var ErrReservedToken = errors.New("fallback: owner token uses a reserved prefix")

// openPrefix starts the token of every unguarded (FailOpen) lease. guard's
// tokens are upper-case base32 and never contain it.
const openPrefix = "fallback-open:"

// Unguarded reports whether lease was handed out by FailOpen: the key is
// recorded nowhere and a duplicate may run at the same time. Its Fence is 0.
func Unguarded(lease guard.Lease) bool { return strings.HasPrefix(lease.Token, openPrefix) }

// Store is a guard.Store that stays safe while its primary is unavailable.
// Every call to the primary passes a circuit breaker and is bounded by
// Options.Timeout; once the breaker is open, the primary is not called at
// all until Options.OpenTimeout has passed. Only unavailability
// (guard.ErrUnavailable, a timeout) counts against the primary. See the
// package documentation for what happens while it is down and when it
// returns. A Store is safe for concurrent use.
type Store struct {
	primary   guard.Store
	secondary guard.Store // nil unless the policy is Secondary
	opts      Options
	cb        *gobreaker.TwoStepCircuitBreaker[struct{}]
	inline    bool // the primary ends its calls by their context's deadline itself

	// gate orders claims sent to the secondary before switch-back checks:
	// a claim holds it shared from the breaker's verdict until the
	// secondary answers; a check takes it exclusively for a moment, which
	// waits for every such claim already decided.
	gate sync.RWMutex
	// consultUntil (unix ns): until then, primary acquisitions are checked
	// against the secondary.
	consultUntil atomic.Int64
	// owners remembers the leases held in the secondary.
	owners owners

	stateMu      sync.Mutex
	stateChanged chan struct{} // closed and replaced on every breaker state change
}

var _ guard.StepStore = (*Store)(nil)

// New returns a Store over primary. It panics if primary is nil, if the
// policy is unknown, or if the policy is Secondary and Options.Secondary is
// nil: these are programming errors, as in guard.New.
func New(primary guard.Store, opts Options) *Store {
	if primary == nil {
		panic("fallback.New: nil primary Store")
	}
	if opts.Policy > FailOpen {
		panic(fmt.Sprintf("fallback.New: unknown Policy %d", opts.Policy))
	}
	if opts.Policy == Secondary && opts.Secondary == nil {
		panic("fallback.New: Policy Secondary needs Options.Secondary")
	}
	opts = opts.withDefaults()
	s := &Store{primary: primary, opts: opts, inline: honoursDeadline(primary)}
	if opts.Policy == Secondary {
		s.secondary = opts.Secondary
	}
	s.owners.m = make(map[ownerKey]time.Time)
	s.stateChanged = make(chan struct{})
	s.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        opts.Name,
		MaxRequests: opts.HalfOpenProbes,
		Timeout:     opts.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= opts.FailuresToOpen },
		IsExcluded:  func(err error) bool { return errors.Is(err, errExcluded) },
		OnStateChange: func(name string, from, to gobreaker.State) {
			s.stateMu.Lock()
			close(s.stateChanged)
			s.stateChanged = make(chan struct{})
			s.stateMu.Unlock()
			if to == gobreaker.StateOpen {
				opts.Logger.Warn("idemguard: primary store unavailable, breaker open",
					"breaker", name, "from", from.String(), "policy", opts.Policy.String(), "retry_in", opts.OpenTimeout)
			} else {
				opts.Logger.Info("idemguard: primary store breaker changed state",
					"breaker", name, "from", from.String(), "to", to.String())
			}
			if opts.OnStateChange != nil {
				opts.OnStateChange(from, to)
			}
		},
	})
	return s
}

// changed returns a channel closed at the breaker's next state change.
func (s *Store) changed() <-chan struct{} {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.stateChanged
}

// State returns the breaker's state: closed (the primary is used), open
// (it is not called), half-open (probes are let through).
func (s *Store) State() gobreaker.State { return s.cb.State() }

// ConsultUntil returns the time until which claims acquired in the primary
// are checked against the secondary (zero if never). It moves forward with
// every write this Store makes to the secondary, by that record's TTL.
func (s *Store) ConsultUntil() time.Time {
	ns := s.consultUntil.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// ConsultSecondary makes claims acquired in the primary be checked against
// the secondary until at least t, as after an outage of this process's
// own. Call it at start-up in a process that may have missed an outage
// other processes wrote to the secondary (t = now + the guard's TTL). It
// does nothing without a secondary.
func (s *Store) ConsultSecondary(t time.Time) {
	if s.secondary == nil {
		return
	}
	ns := t.UnixNano()
	for {
		cur := s.consultUntil.Load()
		if cur >= ns || s.consultUntil.CompareAndSwap(cur, ns) {
			return
		}
	}
}

func (s *Store) consulting() bool {
	return s.secondary != nil && time.Now().UnixNano() < s.consultUntil.Load()
}

// wroteSecondary keeps the switch-back check on for as long as a record
// written now with ttl may live.
func (s *Store) wroteSecondary(ttl time.Duration) {
	s.ConsultSecondary(time.Now().Add(ttl + s.opts.SecondaryTimeout))
}

// Claim implements guard.Store. With the breaker closed it claims in the
// primary (checked against the secondary after an outage); with it open it
// follows the Policy.
func (s *Store) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if strings.HasPrefix(req.Token, openPrefix) {
		return guard.Outcome{}, fmt.Errorf("%w: %q", ErrReservedToken, openPrefix)
	}
	var probeWait <-chan time.Time
	for {
		changed := s.changed()
		s.gate.RLock()
		done, err := s.cb.Allow()
		if err == nil {
			s.gate.RUnlock()
			return s.claimPrimary(ctx, req, done)
		}
		if !errors.Is(err, gobreaker.ErrTooManyRequests) {
			defer s.gate.RUnlock()
			return s.whileDown(ctx, req, err)
		}
		s.gate.RUnlock()
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

// claimPrimary claims in the primary, admitted by the breaker.
func (s *Store) claimPrimary(ctx context.Context, req guard.ClaimRequest, done func(error)) (guard.Outcome, error) {
	defer s.reportPanic(done)
	out, err := call(ctx, s.opts.Timeout, s.inline, func(ctx context.Context) (guard.Outcome, error) {
		return s.primary.Claim(ctx, req)
	})
	s.report(ctx, done, err)
	if err != nil {
		if s.opts.Policy == FailOpen && isOutage(err) && ctx.Err() == nil {
			return s.open(ctx, req, err)
		}
		return guard.Outcome{}, fmt.Errorf("fallback: primary: %w", err)
	}
	if out.Status == guard.Acquired && s.consulting() {
		return s.switchBack(ctx, req, out)
	}
	return out, nil
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

// open lets a claim through unguarded, loudly.
func (s *Store) open(ctx context.Context, req guard.ClaimRequest, cause error) (guard.Outcome, error) {
	s.opts.Logger.WarnContext(ctx, "idemguard: primary store unavailable, running effect UNGUARDED (fail-open)",
		"key", req.Key.String(), "breaker", s.opts.Name, "cause", cause.Error())
	return guard.Outcome{Status: guard.Acquired, Lease: guard.Lease{
		Key: req.Key, Token: openPrefix + req.Token, Fence: 0, Attempt: 1,
	}}, nil
}

// claimSecondary claims in the secondary and remembers a lease it gets.
func (s *Store) claimSecondary(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	s.wroteSecondary(max(req.TTL, req.Lease))
	out, err := call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (guard.Outcome, error) {
		return s.secondary.Claim(ctx, req)
	})
	if err != nil {
		return guard.Outcome{}, fmt.Errorf("fallback: secondary: %w", err)
	}
	if out.Status == guard.Acquired {
		s.owners.hold(req.Key, req.Token, req.Lease)
	}
	return out, nil
}

// switchBack checks a lease just acquired in the primary against the
// secondary (rule 2 of the package documentation).
func (s *Store) switchBack(ctx context.Context, req guard.ClaimRequest, out guard.Outcome) (guard.Outcome, error) {
	s.gate.Lock() // wait for the secondary claims already decided (rule 3)
	s.gate.Unlock()
	rec, err := call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (guard.Record, error) {
		return s.secondary.Get(ctx, req.Key)
	})
	switch {
	case errors.Is(err, guard.ErrNotFound):
		return out, nil
	case err != nil:
		s.undo(ctx, req)
		return guard.Outcome{}, fmt.Errorf("fallback: checking the secondary for %s: %w", req.Key, err)
	case !rec.SameFingerprint(req.Fingerprint): // a RedisStore keeps long fingerprints as digests
		s.undo(ctx, req)
		return guard.Outcome{Status: guard.Mismatch}, nil
	case rec.State == guard.StateCompleted:
		ttl := rec.TTL
		if ttl <= 0 {
			ttl = req.TTL
		}
		if err := s.primaryWrite(context.WithoutCancel(ctx), func(ctx context.Context) error {
			return s.primary.Complete(ctx, guard.Lease{Key: req.Key, Token: req.Token}, rec.Result, ttl)
		}); err != nil {
			// The replay is still right; the primary's claim runs out and
			// the next claim checks again.
			s.opts.Logger.DebugContext(ctx, "idemguard: copying a result into the primary failed",
				"key", req.Key.String(), "err", err.Error())
		}
		return guard.Outcome{Status: guard.Replay, Result: rec.Result}, nil
	default:
		// Pending or failed in the secondary: it keeps the key.
		s.undo(ctx, req)
		return s.claimSecondary(ctx, req)
	}
}

// undo releases a primary claim the switch-back check turned down, even if
// ctx ended. If the release fails, the claim runs out after its lease and
// the next claim is checked again.
func (s *Store) undo(ctx context.Context, req guard.ClaimRequest) {
	_ = s.primaryWrite(context.WithoutCancel(ctx), func(ctx context.Context) error {
		return s.primary.Release(ctx, guard.Lease{Key: req.Key, Token: req.Token})
	})
}

// Complete implements guard.Store; it writes to the store that issued the
// lease. An unguarded lease's Complete succeeds and stores nothing.
func (s *Store) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, second bool) error {
		if second {
			s.wroteSecondary(ttl)
		}
		return st.Complete(ctx, lease, result, ttl)
	})
}

// Fail implements guard.Store; it writes to the store that issued the lease.
func (s *Store) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, second bool) error {
		if second {
			s.wroteSecondary(ttl)
		}
		return st.Fail(ctx, lease, reason, ttl)
	})
}

// Release implements guard.Store; it writes to the store that issued the
// lease.
func (s *Store) Release(ctx context.Context, lease guard.Lease) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, second bool) error {
		err := st.Release(ctx, lease)
		if second && err == nil {
			s.owners.drop(lease.Key, lease.Token)
		}
		return err
	})
}

// Extend implements guard.Store; it writes to the store that issued the
// lease.
func (s *Store) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, second bool) error {
		err := st.Extend(ctx, lease, d)
		if second && err == nil {
			s.owners.hold(lease.Key, lease.Token, d)
		}
		return err
	})
}

// SaveStep implements guard.StepStore: it records the step in the store
// that issued the lease, as the other writes of a holder go. An unguarded
// (FailOpen) lease records nothing and succeeds, as its other writes do.
// A step for a lease whose store keeps no steps (not a guard.StepStore)
// gets an error matching guard.ErrStepsUnsupported; the RedisStore and
// sqlbackstop's Store keep steps.
func (s *Store) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	return s.write(ctx, lease, func(ctx context.Context, st guard.Store, _ bool) error {
		ss, ok := st.(guard.StepStore)
		if !ok {
			return fmt.Errorf("fallback: %w (%T)", guard.ErrStepsUnsupported, st)
		}
		return ss.SaveStep(ctx, lease, index, step)
	})
}

// write sends a holder's write to the store that issued its lease.
func (s *Store) write(ctx context.Context, lease guard.Lease, op func(context.Context, guard.Store, bool) error) error {
	key, token := lease.Key, lease.Token
	if strings.HasPrefix(token, openPrefix) {
		return nil // unguarded: nothing was recorded, nothing to write
	}
	onSecondary := func() error {
		_, err := call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (struct{}, error) {
			return struct{}{}, op(ctx, s.secondary, true)
		})
		return err
	}
	if s.secondary != nil && s.owners.has(key, token) {
		if err := onSecondary(); err != nil {
			return fmt.Errorf("fallback: secondary: %w", err)
		}
		return nil
	}
	err := s.primaryWrite(ctx, func(ctx context.Context) error { return op(ctx, s.primary, false) })
	if err == nil {
		return nil
	}
	if s.consulting() && (errors.Is(err, guard.ErrLeaseLost) || isOutage(err)) && ctx.Err() == nil {
		// Perhaps a lease taken in the secondary so long ago that this
		// Store forgot it: write there if the secondary's record is owned
		// by this token (Release of an absent key would succeed anywhere).
		rec, gerr := call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (guard.Record, error) {
			return s.secondary.Get(ctx, key)
		})
		if gerr == nil && rec.Token == token {
			if serr := onSecondary(); serr != nil {
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
// has no record while switch-back checks are on.
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
		rec, serr := call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (guard.Record, error) {
			return s.secondary.Get(ctx, key)
		})
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

// primaryWrite calls the primary for a holder's write or a read. The open
// breaker stops it; the half-open breaker lets it through without counting
// it as a probe, so holders can finish while the primary is being tried.
func (s *Store) primaryWrite(ctx context.Context, f func(context.Context) error) error {
	done, err := s.cb.Allow()
	if err != nil {
		if !errors.Is(err, gobreaker.ErrTooManyRequests) {
			return fmt.Errorf("%w: %w", guard.ErrUnavailable, err)
		}
		done = func(error) {}
	}
	defer s.reportPanic(done)
	_, err = call(ctx, s.opts.Timeout, s.inline, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) })
	s.report(ctx, done, err)
	return err
}

// errPanicked is what the breaker hears of a primary call that panicked.
var errPanicked = errors.New("fallback: primary store panicked")

// reportPanic, deferred around a primary call, counts a panic as a failure
// (as gobreaker's Execute does), so a panicking probe cannot leave the
// breaker half-open with its probe slot taken. The panic goes on.
func (s *Store) reportPanic(done func(error)) {
	if p := recover(); p != nil {
		done(errPanicked)
		panic(p)
	}
}

// errExcluded marks a call the caller abandoned: it says nothing about the
// primary.
var errExcluded = errors.New("fallback: call abandoned by its caller")

// report tells the breaker how a primary call went: only unavailability is
// a failure; the store's other answers are successes.
func (s *Store) report(ctx context.Context, done func(error), err error) {
	switch {
	case err == nil:
		done(nil)
	case ctx.Err() != nil:
		done(errExcluded)
	case isOutage(err):
		done(err)
	default:
		done(nil)
	}
}

// isOutage reports whether err says the store could not be reached.
func isOutage(err error) bool {
	return errors.Is(err, guard.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// honoursDeadline reports whether st is a RedisStore whose go-redis client
// ends every call by its context's deadline (ContextTimeoutEnabled), so
// that calls need no goroutine of their own to be bounded.
func honoursDeadline(st guard.Store) bool {
	rs, ok := st.(*guard.RedisStore)
	if !ok {
		return false
	}
	switch c := rs.Client().(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// call runs f with a context bounded by d, and returns by then even if f
// does not (a go-redis client without ContextTimeoutEnabled ignores the
// context's deadline on the socket): f runs on a goroutine of its own, and
// one that outlives its bound finishes in the background, its answer
// dropped. A panic in f is raised in the caller. With inline, f is trusted
// to end by the deadline and runs on the caller's goroutine.
func call[T any](ctx context.Context, d time.Duration, inline bool, f func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if inline {
		v, err := f(cctx)
		if err != nil && ctx.Err() == nil && cctx.Err() != nil && !isOutage(err) {
			// Our bound ran out: whatever the store made of it, the
			// primary did not answer in time.
			err = fmt.Errorf("%w: no answer within %s: %w", guard.ErrUnavailable, d, err)
		}
		return v, err
	}
	type answer struct {
		v        T
		err      error
		panicked bool
		p        any
	}
	ch := make(chan answer, 1)
	go func() {
		a := answer{panicked: true}
		defer func() {
			if a.panicked {
				a.p = recover()
			}
			ch <- a
		}()
		a.v, a.err = f(cctx)
		a.panicked = false
	}()
	var a answer
	select {
	case a = <-ch:
	case <-cctx.Done():
		select {
		case a = <-ch: // answered at the deadline: keep the answer
		default:
			var zero T
			if err := ctx.Err(); err != nil {
				return zero, context.Cause(ctx)
			}
			return zero, fmt.Errorf("%w: no answer within %s: %w", guard.ErrUnavailable, d, context.DeadlineExceeded)
		}
	}
	if a.panicked {
		panic(a.p)
	}
	return a.v, a.err
}

// owners remembers the leases taken in the secondary, so their holders'
// writes go there. An entry lives while its lease does, and for a grace
// period after; writes of a forgotten lease still find the secondary
// (see write).
type owners struct {
	mu    sync.Mutex
	m     map[ownerKey]time.Time // lease → when the entry may be forgotten
	swept int                    // entries left by the last sweep
}

type ownerKey struct {
	key   guard.Key
	token string
}

// ownerGrace is the least time an entry is kept after its lease's last
// renewal.
const ownerGrace = time.Minute

func (o *owners) hold(key guard.Key, token string, lease time.Duration) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.m[ownerKey{key, token}] = now.Add(max(2*lease, ownerGrace))
	if len(o.m) >= 2*o.swept+1024 {
		for k, until := range o.m {
			if now.After(until) {
				delete(o.m, k)
			}
		}
		o.swept = len(o.m)
	}
}

func (o *owners) has(key guard.Key, token string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.m[ownerKey{key, token}]
	return ok
}

func (o *owners) drop(key guard.Key, token string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, ownerKey{key, token})
}
