package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// stepPrimary is a switchedPrimary that keeps steps (a RedisStore
// underneath), so that backstop.Wrap over it is a guard.StepStore.
type stepPrimary struct {
	switchedPrimary
	rs *guard.RedisStore
}

func (s *stepPrimary) SaveStep(ctx context.Context, l guard.Lease, i int, st guard.StepResult) error {
	if err := s.err(); err != nil {
		return err
	}
	return s.rs.SaveStep(ctx, l, i, st)
}

// TestStepDuringOutageSeenByRecoveryAfterSwitchBack: a holder claimed
// through fallback over backstop.Wrap on the secondary's tables (the order
// the package documents). Redis goes out, the breaker opens, and the holder
// records a step ("charge", whose effect ran): SaveStep answers nil, the
// step being written to the secondary, whose record is the holder's mark
// (writeTo, toOwner). The holder then dies. Redis returns, the breaker
// closes, and a retry recovers the key through the primary: Wrap answers
// the primary's steps (none), the switch-back check finds the secondary's
// record is the claim's own mark and lets the primary's answer stand, so
// the recovery is told of no step and runs "charge" again, though the
// Store acknowledged it as recorded. (A recovery while the breaker was
// still open, in the secondary, would have been told of it.)
func TestStepDuringOutageSeenByRecoveryAfterSwitchBack(t *testing.T) {
	db := pgenv.Migrated(t, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	prim := &stepPrimary{switchedPrimary: switchedPrimary{Store: rs}, rs: rs}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sec := pgenv.Store(t, db, pgstore.Options{})
	s := newStore(t, backstop.Wrap(prim, b), fallback.Options{Policy: fallback.Secondary, Secondary: sec,
		FailuresToOpen: 1, OpenTimeout: 200 * time.Millisecond, Timeout: 2 * time.Second, Logger: quiet})
	k := guard.Key{Scope: "switchback-steps", ID: t.Name()}
	req := func(tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	}
	out, err := s.Claim(bg, req("H"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim H = %+v, %v", out, err)
	}

	// Redis goes out; the breaker opens; the holder's step is recorded.
	prim.down.Store(true)
	openBreaker(t, s)
	if err := s.SaveStep(bg, out.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}); err != nil {
		// An honest refusal: the step is not claimed to be recorded.
		t.Fatalf("SaveStep during the outage: %v", err)
	}
	// The holder dies here. Redis returns.
	prim.down.Store(false)

	var again guard.Outcome
	n := 0
	waitFor(t, 10*time.Second, "a recovery claim", func() bool {
		n++
		again, err = s.Claim(bg, req(fmt.Sprintf("R%d", n)))
		return err == nil && again.Status == guard.Acquired
	})
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("breaker %v at the recovery, want closed (switched back)", st)
	}
	pg, _ := sec.Get(bg, k)
	if len(again.Steps) != 1 || again.Steps[0].Name != "charge" {
		t.Fatalf("recovery after the switch-back = %s (fence %d) with steps %v; SaveStep answered nil for step \"charge\" "+
			"during the outage (the secondary holds %d step(s) for the key), so its effect would run again",
			again.Status, again.Lease.Fence, again.Steps, len(pg.Steps))
	}
}

// TestStepAfterSwitchBackFollowsOutageStep: the same holder records
// its first step while the breaker is open (written to the secondary, its
// mark), and its second once Redis is back and the breaker closed. doc.go
// (rule 1) says the holder's later writes go to the secondary at once
// once one went there while the breaker was open; but only an Extend moves
// the lease there (owners.hold), so the second step goes to Redis, which
// holds no first step, and is refused with ErrStepOrder: the holder's
// attempt fails though it asked its steps in order.
func TestStepAfterSwitchBackFollowsOutageStep(t *testing.T) {
	db := pgenv.Migrated(t, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	prim := &stepPrimary{switchedPrimary: switchedPrimary{Store: rs}, rs: rs}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sec := pgenv.Store(t, db, pgstore.Options{})
	s := newStore(t, backstop.Wrap(prim, b), fallback.Options{Policy: fallback.Secondary, Secondary: sec,
		FailuresToOpen: 1, OpenTimeout: 200 * time.Millisecond, Timeout: 2 * time.Second, Logger: quiet})
	k := guard.Key{Scope: "switchback-steps", ID: t.Name()}
	out, err := s.Claim(bg, guard.ClaimRequest{Key: k, Token: "H", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim H = %+v, %v", out, err)
	}
	prim.down.Store(true)
	openBreaker(t, s)
	if err := s.SaveStep(bg, out.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}); err != nil {
		t.Fatalf("SaveStep 0 during the outage: %v", err)
	}
	prim.down.Store(false)
	closeBreaker(t, s, 5*time.Second)
	if err := s.SaveStep(bg, out.Lease, 1, guard.StepResult{Name: "ship", Result: []byte("sh_1")}); err != nil {
		t.Fatalf("SaveStep 1 after the switch-back: %v; the holder asked its steps in order", err)
	}
}

// stepBlip fails SaveStep as unavailable while blip is set: one stall of
// the steps' writes, longer than Wrap's retries.
type stepBlip struct {
	stepPrimary
	blip atomic.Bool
}

func (s *stepBlip) SaveStep(ctx context.Context, l guard.Lease, i int, st guard.StepResult) error {
	if s.blip.Load() {
		return fmt.Errorf("%w: no answer within the bound", guard.ErrUnavailable)
	}
	return s.stepPrimary.SaveStep(ctx, l, i, st)
}

// TestStepBlipKeepsStepsTogether: one SaveStep the primary does not answer
// while the breaker stays closed was written to the secondary (the
// holder's mark bears its token: toStandIn) and answered nil; the holder's
// next step went to the primary again (a one-off), which held no first
// step, and was refused with ErrStepOrder though the holder asked its steps
// in order (and a recovery in the primary would not have seen the first).
// Such a step is refused as unavailable now: it may or may not be recorded
// in the primary, and the holder stops.
func TestStepBlipKeepsStepsTogether(t *testing.T) {
	db := pgenv.Migrated(t, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	prim := &stepBlip{stepPrimary: stepPrimary{switchedPrimary: switchedPrimary{Store: rs}, rs: rs}}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sec := pgenv.Store(t, db, pgstore.Options{})
	s := newStore(t, backstop.Wrap(prim, b), fallback.Options{Policy: fallback.Secondary, Secondary: sec,
		Timeout: time.Second, Logger: quiet})
	k := guard.Key{Scope: "switchback-steps", ID: t.Name()}
	out, err := s.Claim(bg, guard.ClaimRequest{Key: k, Token: "H", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim H = %+v, %v", out, err)
	}
	prim.blip.Store(true) // past Wrap's own retries of the step: it does not reach Redis late
	err0 := s.SaveStep(bg, out.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")})
	prim.blip.Store(false)
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("breaker %v after one blip", st)
	}
	if err0 != nil {
		if !errors.Is(err0, guard.ErrUnavailable) {
			t.Fatalf("SaveStep 0 during the blip: %v, want unavailable (or recorded where the next step finds it)", err0)
		}
		return // the step is not said to be recorded: the holder stops
	}
	if err := s.SaveStep(bg, out.Lease, 1, guard.StepResult{Name: "ship", Result: []byte("sh_1")}); err != nil {
		t.Fatalf("SaveStep 0 answered nil (blip), SaveStep 1 = %v; the holder asked its steps in order", err)
	}
}
