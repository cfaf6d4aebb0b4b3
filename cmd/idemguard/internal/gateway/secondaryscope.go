package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// SecondaryScope is the scope under which a gateway with Redis prefix
// prefix keeps the key of scope in its fallback PostgreSQL: the prefix,
// quoted, then a colon, then the scope (the scope's SHA-256, in hex after
// "sha256:", where the whole would be longer than guard.MaxScopeLen; the
// prefix's, quoted, where the prefix alone is longer than
// maxPrefixTag). Gateways of different services (a prefix each) that
// share one PostgreSQL never meet there, as they never meet in Redis; a
// scope the gateway builds (a quoted caller then a space, a method, or
// "sha256:") never begins with a quoted string and a colon, so no row an
// older version wrote has this form (docs/design.md, "The gateway's
// fallback PostgreSQL"). idemguard inspect --postgres reads it.
func SecondaryScope(prefix, scope string) string {
	tag := SecondaryScopeTag(prefix)
	s := tag + scope
	if len(s) > guard.MaxScopeLen {
		sum := sha256.Sum256([]byte(scope))
		s = tag + "sha256:" + hex.EncodeToString(sum[:])
	}
	return s
}

// SecondaryScopeTag is what every scope SecondaryScope gives for prefix
// begins with, and no other's does.
func SecondaryScopeTag(prefix string) string {
	q := strconv.Quote(prefix)
	if len(q) > maxPrefixTag {
		sum := sha256.Sum256([]byte(prefix))
		q = strconv.Quote("sha256:" + hex.EncodeToString(sum[:]))
	}
	return q + ":"
}

// maxPrefixTag bounds the quoted prefix in a secondary scope, so that a
// scope's digest always fits guard.MaxScopeLen beside it.
const maxPrefixTag = 256

// scopedSecondary is the gateway's fallback PostgreSQL store as package
// fallback sees it: every key goes in under SecondaryScope and comes back
// out as it was given, in every method (Lease.Key, Record.Key).
//
// Rows an older version wrote are under the bare scope, shared by every
// gateway of the table. Until the last of them expires (legacyUntil,
// found at start), they are honoured as that version honoured them, read
// only, as pgstore's Claim would answer them: another fingerprint is a
// mismatch, a completed one is replayed, a pending one with a live lease
// is in progress, one whose attempts are spent is exhausted; and Get
// falls back to it when the gateway's own row is missing. So an upgrade
// after an outage runs no effect twice. A failed one, or a pending one
// whose lease ran out, with attempts left, is claimed afresh under the
// new scope (attempts and fence start again). No row is ever written
// under the bare scope.
type scopedSecondary struct {
	st          guard.Store
	prefix      string
	legacyUntil atomic.Int64 // unix ns; zero: no older version's row is live
}

var (
	_ guard.StepStore     = (*scopedSecondary)(nil)
	_ guard.DeadlineStore = (*scopedSecondary)(nil)
)

func newScopedSecondary(st guard.Store, prefix string) *scopedSecondary {
	return &scopedSecondary{st: st, prefix: prefix}
}

// honourLegacy makes the rows an older version wrote be read until t.
func (s *scopedSecondary) honourLegacy(t time.Time) {
	ns := int64(math.MaxInt64) // UnixNano would wrap past 2262: as good as for ever
	if t.Before(time.Unix(0, math.MaxInt64)) {
		ns = t.UnixNano()
	}
	for {
		cur := s.legacyUntil.Load()
		if cur >= ns || s.legacyUntil.CompareAndSwap(cur, ns) {
			return
		}
	}
}

func (s *scopedSecondary) legacy() bool { return time.Now().UnixNano() < s.legacyUntil.Load() }

func (s *scopedSecondary) key(k guard.Key) guard.Key {
	return guard.Key{Scope: SecondaryScope(s.prefix, k.Scope), ID: k.ID}
}

func (s *scopedSecondary) lease(l guard.Lease) guard.Lease {
	l.Key = s.key(l.Key)
	return l
}

// Claim implements guard.Store.
func (s *scopedSecondary) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if err := req.Key.Validate(); err != nil {
		return guard.Outcome{}, err // as the store would refuse it, with the key as given
	}
	var older []guard.StepResult // the steps of an older version's row claimed afresh
	if s.legacy() {
		rec, err := s.st.Get(ctx, req.Key)
		switch {
		case errors.Is(err, guard.ErrNotFound):
		case err != nil:
			return guard.Outcome{}, fmt.Errorf("reading the row an older version kept for %s: %w", req.Key, err)
		case !rec.SameFingerprint(req.Fingerprint):
			return guard.Outcome{Status: guard.Mismatch}, nil
		case rec.State == guard.StateCompleted:
			return guard.Outcome{Status: guard.Replay, Result: rec.Result}, nil
		case rec.State == guard.StatePending && rec.LeaseLeft > 0:
			return guard.Outcome{Status: guard.InProgress, LeaseLeft: rec.LeaseLeft}, nil
		case req.MaxAttempts > 0 && rec.Attempt >= req.MaxAttempts:
			reason := rec.LastError
			if rec.State == guard.StatePending {
				reason = "lease expired"
			}
			return guard.Outcome{Status: guard.Exhausted, Attempts: rec.Attempt, LastError: reason}, nil
		default:
			older = rec.Steps
		}
	}
	inner := req
	inner.Key = s.key(req.Key)
	out, err := s.st.Claim(ctx, inner)
	if err == nil && out.Status == guard.Acquired && len(older) > len(out.Steps) {
		// The older row's steps are this key's (a forward step among
		// them: its request may have reached the upstream): the claim
		// under the new scope holds them, or it runs their effects again.
		if err := s.copySteps(ctx, out, older); err != nil {
			_ = s.st.Release(context.WithoutCancel(ctx), out.Lease)
			return guard.Outcome{}, fmt.Errorf("%w: copying the steps of the row an older version kept for %s: %w", guard.ErrUnavailable, req.Key, err)
		}
		out.Steps = older
	}
	if out.Status == guard.Acquired {
		out.Lease.Key = req.Key
	}
	return out, err
}

// copySteps records under out's lease (in the inner store) the steps of
// want that out lacks; out's steps must be their start.
func (s *scopedSecondary) copySteps(ctx context.Context, out guard.Outcome, want []guard.StepResult) error {
	ss, ok := s.st.(guard.StepStore)
	if !ok {
		return fmt.Errorf("gateway: %w (%T)", guard.ErrStepsUnsupported, s.st)
	}
	for i, st := range out.Steps {
		if st.Name != want[i].Name {
			return fmt.Errorf("%w: step %d is %q, %q in the older row", guard.ErrStepOrder, i, st.Name, want[i].Name)
		}
	}
	for i := len(out.Steps); i < len(want); i++ {
		if err := ss.SaveStep(ctx, out.Lease, i, want[i]); err != nil {
			return err
		}
	}
	return nil
}

// Complete implements guard.Store.
func (s *scopedSecondary) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	return s.st.Complete(ctx, s.lease(lease), result, ttl)
}

// Fail implements guard.Store.
func (s *scopedSecondary) Fail(ctx context.Context, lease guard.Lease, reason string, ttl time.Duration) error {
	return s.st.Fail(ctx, s.lease(lease), reason, ttl)
}

// Release implements guard.Store.
func (s *scopedSecondary) Release(ctx context.Context, lease guard.Lease) error {
	return s.st.Release(ctx, s.lease(lease))
}

// Extend implements guard.Store.
func (s *scopedSecondary) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	return s.st.Extend(ctx, s.lease(lease), d)
}

// Get implements guard.Store: the gateway's own row, or (while an older
// version's rows live) the one under the bare scope.
func (s *scopedSecondary) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	rec, err := s.st.Get(ctx, s.key(key))
	if errors.Is(err, guard.ErrNotFound) && s.legacy() {
		rec, err = s.st.Get(ctx, key)
	}
	if err != nil {
		return guard.Record{}, err
	}
	rec.Key = key
	return rec, nil
}

// SaveStep implements guard.StepStore.
func (s *scopedSecondary) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	ss, ok := s.st.(guard.StepStore)
	if !ok {
		return fmt.Errorf("gateway: %w (%T)", guard.ErrStepsUnsupported, s.st)
	}
	return ss.SaveStep(ctx, s.lease(lease), index, step)
}

// KeepsSteps reports whether the store it wraps keeps steps.
func (s *scopedSecondary) KeepsSteps() bool { return guard.KeepsSteps(s.st) }

// HonoursDeadline implements guard.DeadlineStore by asking the store it
// wraps (false when that one cannot tell).
func (s *scopedSecondary) HonoursDeadline() bool {
	ds, ok := s.st.(guard.DeadlineStore)
	return ok && ds.HonoursDeadline()
}
