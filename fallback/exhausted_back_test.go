package fallback_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// switchedPrimary is a primary that answers ErrUnavailable for every call
// while down is set (an outage the test turns on and off).
type switchedPrimary struct {
	guard.Store
	down atomic.Bool
}

func (s *switchedPrimary) err() error {
	if s.down.Load() {
		return fmt.Errorf("%w: primary switched off", guard.ErrUnavailable)
	}
	return nil
}

func (s *switchedPrimary) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if err := s.err(); err != nil {
		return guard.Outcome{}, err
	}
	return s.Store.Claim(ctx, req)
}

func (s *switchedPrimary) Complete(ctx context.Context, l guard.Lease, r []byte, ttl time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Complete(ctx, l, r, ttl)
}

func (s *switchedPrimary) Fail(ctx context.Context, l guard.Lease, why string, ttl time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Fail(ctx, l, why, ttl)
}

func (s *switchedPrimary) Release(ctx context.Context, l guard.Lease) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Release(ctx, l)
}

func (s *switchedPrimary) Extend(ctx context.Context, l guard.Lease, d time.Duration) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.Store.Extend(ctx, l, d)
}

func (s *switchedPrimary) Get(ctx context.Context, k guard.Key) (guard.Record, error) {
	if err := s.err(); err != nil {
		return guard.Record{}, err
	}
	return s.Store.Get(ctx, k)
}

// TestExhaustedPrimaryReplaysSecondaryCompletion: a key the secondary
// completed during an outage is answered with its result when the primary
// returns, not with the primary's stale verdict: here the primary holds an
// abandoned claim of the key's only attempt (MaxAttempts 1) from before
// the outage, so it answers Exhausted. The switch-back check (rule 2) was
// made only for Acquired, and the client was told the key failed for good
// though its effect ran and its result is stored (found by review).
func TestExhaustedPrimaryReplaysSecondaryCompletion(t *testing.T) {
	prim := &switchedPrimary{Store: memstore.New(memstore.Options{})}
	sec := memstore.New(memstore.Options{})
	s := newStore(t, prim, fallback.Options{Policy: fallback.Secondary, Secondary: sec,
		FailuresToOpen: 1, OpenTimeout: 50 * time.Millisecond, Timeout: time.Second, Logger: quiet})
	k := guard.Key{Scope: "exhausted-back", ID: "exhausted"}
	req := func(tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: 50 * time.Millisecond,
			TTL: time.Minute, MaxAttempts: 1}
	}

	// Before the outage: a claim in the primary whose holder died.
	if out, err := s.Claim(bg, req("A")); err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim A = %+v, %v", out, err)
	}
	// The outage: the breaker opens; a retry claims in the secondary and
	// completes there.
	prim.down.Store(true)
	openBreaker(t, s)
	out, err := s.Claim(bg, req("B"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim B during the outage = %+v, %v", out, err)
	}
	if err := s.Complete(bg, out.Lease, []byte("paid"), time.Minute); err != nil {
		t.Fatalf("complete B: %v", err)
	}
	// The primary returns; A's lease is long over.
	prim.down.Store(false)
	waitFor(t, 5*time.Second, "breaker half-open", func() bool { return s.State() != fallback.StateOpen })

	out, err = s.Claim(bg, req("C"))
	if err != nil || out.Status != guard.Replay || string(out.Result) != "paid" {
		t.Fatalf("retry after the switch-back = %+v, %v; want Replay of %q (the secondary holds the key completed)",
			out, err, "paid")
	}
}
