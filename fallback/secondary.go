package fallback

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// ConsultUntil returns the time until which a claim acquired in the
// primary is refused when the secondary cannot be read to check it (zero
// if never); every acquisition is checked, and outside this window one the
// secondary cannot answer for stands (see the package documentation). It
// moves forward with every write this Store makes to the secondary, by as
// long as that record may live: a claim's or an extension's lease and the
// TTL after it, a completion's or failure's TTL.
func (s *Store) ConsultUntil() time.Time {
	ns := s.consultUntil.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// ConsultSecondary makes a claim acquired in the primary be refused when
// the secondary cannot be read to check it, until at least t, as after an
// outage of this process's own (ConsultUntil). Call it at start-up in a
// process that may have missed an outage other processes wrote to the
// secondary (t = now + the guard's TTL). It does nothing without a
// secondary.
func (s *Store) ConsultSecondary(t time.Time) {
	if s.secondary == nil {
		return
	}
	ns := t.UnixNano()
	if t.After(maxUnixNano) {
		ns = math.MaxInt64 // UnixNano would wrap: a window to the year 2262 is as good as for ever
	}
	for {
		cur := s.consultUntil.Load()
		if cur >= ns || s.consultUntil.CompareAndSwap(cur, ns) {
			return
		}
	}
}

// maxUnixNano is the latest time UnixNano counts.
var maxUnixNano = time.Unix(0, math.MaxInt64)

func (s *Store) consulting() bool {
	return s.secondary != nil && time.Now().UnixNano() < s.consultUntil.Load()
}

// wroteSecondary keeps the switch-back check on for as long as a record
// written now with ttl may live.
func (s *Store) wroteSecondary(ttl time.Duration) {
	s.ConsultSecondary(time.Now().Add(satAdd(ttl, s.opts.SecondaryTimeout)))
}

// satAdd is a + b for durations that are not negative, at most the
// longest one.
func satAdd(a, b time.Duration) time.Duration {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// claimSecondary claims in the secondary and remembers a lease it gets.
func (s *Store) claimSecondary(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	// A claimed record is kept for its lease and the TTL after it.
	for {
		cur := s.secondaryTTL.Load()
		if int64(req.TTL) <= cur || s.secondaryTTL.CompareAndSwap(cur, int64(req.TTL)) {
			break
		}
	}
	s.wroteSecondary(satAdd(req.TTL, req.Lease))
	out, err := callClaim(ctx, s.opts.SecondaryTimeout, s.secondary, req)
	if err != nil {
		return guard.Outcome{}, fmt.Errorf("fallback: secondary: %w", err)
	}
	if out.Status == guard.Acquired {
		s.owners.hold(req.Key, req.Token, req.Lease)
	}
	return out, nil
}

// getSecondary reads key from the secondary, bounded by SecondaryTimeout.
func (s *Store) getSecondary(ctx context.Context, key guard.Key) (guard.Record, error) {
	return call(ctx, s.opts.SecondaryTimeout, false, func(ctx context.Context) (guard.Record, error) {
		return s.secondary.Get(ctx, key)
	}, nil)
}

// switchBack checks a lease just acquired in the primary against the
// secondary (rule 2 of the package documentation), and a key the primary
// answered exhausted: one the secondary completed (its holder in the
// primary died, and a retry completed it during an outage) is replayed,
// not given up.
func (s *Store) switchBack(ctx context.Context, req guard.ClaimRequest, out guard.Outcome) (guard.Outcome, error) {
	granted := out.Status == guard.Acquired
	if !s.consulting() && time.Now().UnixNano() < s.uncheckedUntil.Load() {
		return out, nil // the secondary did not answer such a check just now (below)
	}
	s.gate.drain() // wait for the secondary claims already decided (rule 3)
	rec, err := s.getSecondary(ctx, req.Key)
	switch {
	case errors.Is(err, guard.ErrNotFound):
		return out, nil
	case err != nil && ctx.Err() == nil && !s.consulting():
		// Nothing this Store wrote to the secondary may live there: what
		// the check looks for is another process's outage (a replica
		// whose breaker opened when this one's did not). A secondary that
		// cannot answer it does not stop a primary that answers, nor is it
		// asked again for OpenTimeout: its trouble costs claims no more
		// than one bound each while Redis serves them.
		s.uncheckedUntil.Store(time.Now().Add(s.opts.OpenTimeout).UnixNano())
		s.opts.Logger.WarnContext(ctx, "idemguard: the secondary store cannot be checked; claims the primary grants are not checked against it for a while",
			"breaker", s.opts.Name, "for", s.opts.OpenTimeout.String(), "err", err.Error())
		return out, nil
	case err != nil:
		if granted {
			s.undo(ctx, req)
		}
		return guard.Outcome{}, fmt.Errorf("fallback: checking the secondary for %s: %w", req.Key, err)
	case !granted && (rec.State != guard.StateCompleted || !rec.SameFingerprint(req.Fingerprint)):
		return out, nil // exhausted in the primary; the secondary replays nothing
	case rec.State == guard.StatePending && rec.Token == req.Token:
		// The record is this very claim's: a primary that writes the
		// table the secondary reads (backstop.Wrap's mark, in the keys
		// table it shares with pgstore's Store) holds it. The primary's
		// lease stands. Steps its holders recorded there while the
		// primary was out (a write the secondary took for a primary
		// lease: writeTo) are this key's too: copied into the primary
		// under the lease just taken, and answered, or a step whose
		// effect ran runs again.
		if len(rec.Steps) > len(out.Steps) {
			if err := s.copySteps(ctx, out, rec.Steps); err != nil {
				s.undo(ctx, req)
				return guard.Outcome{}, fmt.Errorf("%w: fallback: copying the secondary's steps of %s into the primary: %w",
					guard.ErrUnavailable, req.Key, err)
			}
			out.Steps = rec.Steps
		}
		return out, nil
	case !rec.SameFingerprint(req.Fingerprint): // a RedisStore keeps long fingerprints as digests
		s.undo(ctx, req)
		return guard.Outcome{Status: guard.Mismatch}, nil
	case rec.State == guard.StateCompleted && !granted:
		return guard.Outcome{Status: guard.Replay, Result: rec.Result}, nil
	case rec.State == guard.StateCompleted:
		ttl := rec.TTL
		if ttl <= 0 {
			ttl = req.TTL
		}
		// A holder's write (of the claim the primary just granted): no
		// state of the breaker refuses it untried, or the claim would
		// stay pending in the primary for its lease, and retries answered
		// in progress instead of replayed.
		if err := s.holderWrite(context.WithoutCancel(ctx), true, func(ctx context.Context) error {
			return s.primary.Complete(ctx, guard.Lease{Key: req.Key, Token: req.Token}, rec.Result, ttl)
		}); err != nil {
			// The replay is still right; the primary's claim runs out and
			// the next claim checks again.
			s.opts.Logger.DebugContext(ctx, "idemguard: copying a result into the primary failed",
				"key", req.Key.String(), "err", err.Error())
		}
		return guard.Outcome{Status: guard.Replay, Result: rec.Result}, nil
	default:
		// Pending or failed in the secondary: it keeps the key. The
		// primary's claim is given back once the secondary has answered,
		// not before: in between, the key would be held in neither store
		// (its holder there giving it back meanwhile), and another claim
		// the primary granted would find nothing in the secondary and
		// keep its lease while this one took the secondary's.
		o, err := s.claimSecondary(ctx, req)
		s.undo(ctx, req)
		return o, err
	}
}

// copySteps records in the primary, under out's lease, the steps of want
// that out (the primary's answer) lacks; out's steps must be their start.
func (s *Store) copySteps(ctx context.Context, out guard.Outcome, want []guard.StepResult) error {
	ss, ok := s.primary.(guard.StepStore)
	if !ok {
		return fmt.Errorf("fallback: %w (%T)", guard.ErrStepsUnsupported, s.primary)
	}
	for i, st := range out.Steps {
		if st.Name != want[i].Name || !bytes.Equal(st.Result, want[i].Result) {
			return fmt.Errorf("%w: step %d is %q in the primary, %q in the secondary", guard.ErrStepOrder, i, st.Name, want[i].Name)
		}
	}
	for i := len(out.Steps); i < len(want); i++ {
		if err := s.holderWrite(context.WithoutCancel(ctx), true, func(ctx context.Context) error {
			return ss.SaveStep(ctx, out.Lease, i, want[i])
		}); err != nil {
			return err
		}
	}
	return nil
}

// undo releases a primary claim the switch-back check turned down, even if
// ctx ended, and whatever the breaker's state (a holder's write of the
// claim the primary just granted: refused untried, it stayed pending for
// its lease). If the release fails, the claim runs out after its lease
// and the next claim is checked again.
func (s *Store) undo(ctx context.Context, req guard.ClaimRequest) {
	_ = s.holderWrite(context.WithoutCancel(ctx), true, func(ctx context.Context) error {
		return s.primary.Release(ctx, guard.Lease{Key: req.Key, Token: req.Token})
	})
}

// gate orders the claims sent to the secondary before the switch-back
// checks (rule 3 of the package documentation). A claim enters before the
// breaker's verdict and leaves once it knows it is not going to the
// secondary, or once the secondary has answered it; a check drains the
// gate first.
type gate struct{ mu sync.RWMutex }

func (g *gate) enter() { g.mu.RLock() }
func (g *gate) leave() { g.mu.RUnlock() }

// drain returns once every claim that entered before it has left. Claims
// entering while it waits wait for it (sync.RWMutex lets no new reader in
// while a writer waits), so it cannot starve and the wait is bounded by
// the slowest claim under way: SecondaryTimeout.
func (g *gate) drain() {
	// The write lock guards no data: taking it is the wait. An empty
	// critical section is the point here, not a mistake.
	g.mu.Lock()
	//lint:ignore SA2001 a barrier: Lock waited for every claim that entered before it.
	g.mu.Unlock()
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

// hold remembers the lease of token on key for twice lease (at least
// ownerGrace) from now, or longer if it was remembered for longer: a
// write that does not know the lease's length (SaveStep gives 0) must not
// cut down what its claim or last extension set.
func (o *owners) hold(key guard.Key, token string, lease time.Duration) {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[ownerKey]time.Time)
	}
	k := ownerKey{key, token}
	if until := now.Add(max(2*lease, ownerGrace)); until.After(o.m[k]) {
		o.m[k] = until
	}
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
