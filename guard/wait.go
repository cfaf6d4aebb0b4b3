package guard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// WaitOptions configure one Wait. The zero value waits up to the guard's
// Options.Lease.
type WaitOptions struct {
	// Timeout bounds the wait. Zero waits up to the guard's
	// Options.Lease: by then a live holder has answered or is still
	// working on a long effect, and a dead one's lease has run out, so
	// the key can be recovered. Negative: no bound but ctx's.
	Timeout time.Duration
	// CallOptions change the guard's Options for the claim Wait makes,
	// as for ClaimWith. The zero value keeps the guard's.
	CallOptions
}

// Polling while Wait waits: the first look after firstPoll, each next one
// twice as late, up to maxPoll apart, each with up to a fifth of random
// jitter so that the duplicates of one key spread out. A duplicate hears
// of the first holder's result at most about maxPoll after it was stored,
// for one read of the record per poll.
const (
	firstPoll = 10 * time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// Wait is for a caller whose claim of key was answered *InProgressError
// (another holder runs the effect): it waits until the key is no longer
// held, then claims it as ClaimWith does, and returns that claim's
// answer. So a duplicate gets, as soon as Wait sees it:
//   - the first holder's stored result (a Replay outcome);
//   - the key (Acquired, to be ended with Complete, Fail or Release as
//     after Claim) when the holder released it, failed it (up to
//     MaxAttempts) or let its lease run out;
//   - ErrMismatch, *ExhaustedError or an error of the store, as Claim
//     would.
//
// While the key is held Wait reads its record (Get: no claim, no event
// for the Observer) after 10 ms, then twice as late each time up to
// 100 ms apart, with jitter, and claims only once the record is no longer
// pending with a live lease; a claim that still finds it in progress
// (another duplicate came first) goes on waiting.
//
// When opts.Timeout passes first, Wait returns the latest
// *InProgressError (its RetryAfter is what was left of the holder's lease
// at the last look); a read of the record under way then is given up
// (on a store whose calls end by their context's deadline). When ctx ends first, it returns an error matching
// ctx.Err() (and context.Cause(ctx)), and nothing was claimed. The claim
// itself is not cut off by ctx (it is bounded as Claim's is): a claim the
// store took is reported, Acquired, even if ctx ended meanwhile, so the
// caller that no longer wants it must Release it.
func (g *Guard) Wait(ctx context.Context, key Key, fingerprint string, opts WaitOptions) (Outcome, error) {
	if err := key.Validate(); err != nil {
		return Outcome{}, err
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = g.opts.Lease
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	var inFlight error = &InProgressError{Key: key}
	delay := firstPoll
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	looked := false // the last look was made
	for {
		d := delay + rand.N(delay/5+1)
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return Outcome{}, inFlight
			}
			if looked {
				// Nothing more to read: the rest of the wait goes by
				// (without this, every look after the last one came at
				// once, back to back until the deadline).
				timer.Reset(left)
				select {
				case <-ctx.Done():
					return Outcome{}, waitEnded(ctx, key)
				case <-timer.C:
				}
				return Outcome{}, inFlight
			}
			// The last look comes readGrace before the deadline (at once
			// under a Timeout shorter than that), so that its read can
			// answer: made at the deadline, it was cut off unread.
			if last := max(left-readGrace, 0); last <= d {
				d, looked = last, true
			}
		}
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return Outcome{}, waitEnded(ctx, key)
		case <-timer.C:
		}
		delay = min(delay*2, maxPoll)
		rec, err := g.read(ctx, key, deadline)
		if ctx.Err() != nil {
			return Outcome{}, waitEnded(ctx, key)
		}
		if err != nil && !deadline.IsZero() && !time.Now().Before(deadline) {
			return Outcome{}, inFlight // the read did not answer within the timeout
		}
		if err == nil && rec.State == StatePending && rec.LeaseLeft > 0 && rec.SameFingerprint(fingerprint) {
			// Still running. A holder of another payload (the first
			// released, another request of the key claimed it) is a
			// mismatch, which the claim answers, as Claim would at once.
			inFlight = &InProgressError{Key: key, RetryAfter: rec.LeaseLeft}
			continue
		}
		out, err := g.claim(context.WithoutCancel(ctx), key, fingerprint, opts.CallOptions)
		if _, busy := errors.AsType[*InProgressError](err); busy {
			inFlight = err
			continue
		}
		return out, err
	}
}

// readGrace is the least time Wait gives a look at the record to answer.
const readGrace = 10 * time.Millisecond

// read is Wait's look at the record of key, ended at deadline (if not
// zero, and at least readGrace from now) as well as with ctx.
func (g *Guard) read(ctx context.Context, key Key, deadline time.Time) (Record, error) {
	if deadline.IsZero() {
		return g.store.Get(ctx, key)
	}
	rctx, cancel := context.WithDeadline(ctx, maxTime(deadline, time.Now().Add(readGrace)))
	defer cancel()
	return g.store.Get(rctx, key)
}

// waitEnded is Wait's error when ctx ended: it matches ctx.Err() and
// ctx's cause.
func waitEnded(ctx context.Context, key Key) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || errors.Is(cause, err) {
		return fmt.Errorf("wait %s: %w", key, err)
	}
	return fmt.Errorf("wait %s: %w: %w", key, err, cause)
}
