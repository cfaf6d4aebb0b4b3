package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// claimPrimary claims in the primary, admitted by the breaker.
func (s *Store) claimPrimary(ctx context.Context, req guard.ClaimRequest, done func(error)) (guard.Outcome, error) {
	out, err := s.primaryClaim(ctx, req, done)
	if err != nil {
		if s.opts.Policy == FailOpen && isOutage(err) && ctx.Err() == nil {
			return s.open(ctx, req, err)
		}
		return guard.Outcome{}, fmt.Errorf("fallback: primary: %w", err)
	}
	if (out.Status == guard.Acquired || out.Status == guard.Exhausted) && s.secondary != nil {
		return s.switchBack(ctx, req, out)
	}
	return out, nil
}

// primaryClaim makes req's claim in the primary and reports it to the
// breaker (done), a panic of the primary's as a failure. A panic after it
// (the secondary's, in the switch-back) is not the primary's, and the
// breaker hears of each call once.
func (s *Store) primaryClaim(ctx context.Context, req guard.ClaimRequest, done func(error)) (guard.Outcome, error) {
	defer reportPanic(done)
	out, err := callClaim(ctx, s.opts.Timeout, s.primary, req)
	s.cb.report(ctx, done, err)
	return out, err
}

// primaryWrite calls the primary for a read or for a write of the
// Store's own. The open breaker stops it; the half-open breaker lets it
// through as a probe while a probe's place is free, and uncounted once
// they are taken.
func (s *Store) primaryWrite(ctx context.Context, f func(context.Context) error) error {
	return s.primaryCall(ctx, false, f)
}

// holderWrite calls the primary for a holder's write (Complete, Fail,
// Release, Extend, SaveStep of a lease the primary issued). No state of
// the breaker stops it, and while the breaker is not closed it is not
// counted: only the primary takes that write (or, with a secondary, its
// record bearing the lease's token, which write tries next). Refused
// without a try, it was lost even when the primary was back before the
// breaker let calls through again: the claim stayed pending for its
// lease, and a retry then ran the effect again (a completion lost) or
// waited that lease for nothing (a failure or release lost, which
// backstop.Wrap's mark kept too). It is bounded by Options.Timeout like
// every call; the holders that write while the breaker is open are only
// the ones that claimed in the primary before it opened. Without counted
// it is never counted (Extend).
func (s *Store) holderWrite(ctx context.Context, counted bool, f func(context.Context) error) error {
	if !counted {
		_, err := call(ctx, s.opts.Timeout, s.inline, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) }, nil)
		return err
	}
	return s.primaryCall(ctx, true, f)
}

// primaryCall calls the primary with f, admitted by the breaker: always if
// holder (then uncounted while the breaker is not closed), otherwise only
// while it is closed or half-open (uncounted then).
func (s *Store) primaryCall(ctx context.Context, holder bool, f func(context.Context) error) error {
	var done func(error)
	var err error
	if holder && s.cb.state() != StateClosed {
		// Not through allow: the half-open breaker would count it as one
		// of the probes it keeps for claims.
		done = func(error) {}
	} else {
		done, err = s.cb.allow()
	}
	switch {
	case errors.Is(err, errProbing) || err != nil && holder:
		done = func(error) {}
	case err != nil:
		return fmt.Errorf("%w: %w", guard.ErrUnavailable, err)
	}
	defer reportPanic(done)
	_, err = call(ctx, s.opts.Timeout, s.inline, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) }, nil)
	s.cb.report(ctx, done, err)
	return err
}

// honoursDeadline reports whether st says its calls end by their
// context's deadline (guard.DeadlineStore), so that calls need no
// goroutine of their own to be bounded.
func honoursDeadline(st guard.Store) bool {
	ds, ok := st.(guard.DeadlineStore)
	return ok && ds.HonoursDeadline()
}

// callClaim is st.Claim(req) through call: the caller is answered within
// d, but the claim itself is not cut off at d. It runs on a goroutine of
// its own, whatever inline says, with ctx's deadline (the lease's first
// deadline under guard; req.Lease after it was sent when ctx has none)
// and not ctx's cancellation, so that its answer is heard even when it
// comes after the caller was answered ErrUnavailable, or went away: a
// claim abandoned at d (or at a cancellation) by a client that
// honours deadlines (go-redis with ContextTimeoutEnabled closes the
// connection) could still be applied once the store got to it, with
// nobody left to hear it. A claim answered Acquired after the caller gave
// up has no holder. It is released, as guard releases a claim answered
// after its lease's deadline, so that the key is not left pending for a
// lease nobody holds (every retry told it is in progress, then an attempt
// counted for an effect that never ran). The release is bounded by d.
// A claim still unanswered at its own bound is the case guard leaves
// too: applied after that, it is pending for its lease.
func callClaim(ctx context.Context, d time.Duration, st guard.Store, req guard.ClaimRequest) (guard.Outcome, error) {
	if ctx.Err() != nil {
		// Its caller has gone already: not sent (sent, it would run on
		// past ctx, and could even be answered before call saw ctx end).
		return guard.Outcome{}, fmt.Errorf("claim not sent: %w", context.Cause(ctx))
	}
	return call(ctx, d, false, func(context.Context) (guard.Outcome, error) {
		bound, ok := ctx.Deadline()
		if !ok {
			bound = time.Now().Add(req.Lease)
		}
		cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), bound)
		defer cancel()
		return st.Claim(cctx, req)
	}, func(out guard.Outcome, err error) {
		if err != nil || out.Status != guard.Acquired {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
		defer cancel()
		_ = st.Release(rctx, out.Lease)
	})
}

// call runs f with a context bounded by d, and returns by then even if f
// does not (a go-redis client without ContextTimeoutEnabled ignores the
// context's deadline on the socket): f runs on a goroutine of its own, and
// one that outlives its bound (or ctx) finishes in the background, its
// answer given to abandoned (if not nil) on that goroutine. A panic in f
// is raised in the caller (dropped once f is abandoned). With inline, f
// is trusted to end by the deadline and runs on the caller's goroutine.
func call[T any](ctx context.Context, d time.Duration, inline bool, f func(context.Context) (T, error),
	abandoned func(T, error)) (T, error) {
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
	var (
		mu   sync.Mutex
		gone bool // the caller returned without the answer
	)
	go func() {
		a := answer{panicked: true}
		defer func() {
			if a.panicked {
				a.p = recover()
			}
			mu.Lock()
			late := gone
			if !late {
				ch <- a
			}
			mu.Unlock()
			if late && !a.panicked && abandoned != nil {
				abandoned(a.v, a.err)
			}
		}()
		a.v, a.err = f(cctx)
		a.panicked = false
	}()
	var a answer
	select {
	case a = <-ch:
	case <-cctx.Done():
		mu.Lock()
		select {
		case a = <-ch: // answered at the deadline: keep the answer
			mu.Unlock()
		default:
			gone = true
			mu.Unlock()
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
