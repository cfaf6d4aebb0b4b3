package fallback_test

import (
	"context"
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

// extendBlip is a Redis store whose next Extend fails as
// unavailable once (one slow answer), and which counts the Extends and
// steps that reach it.
type extendBlip struct {
	*guard.RedisStore
	blip    atomic.Bool
	extends atomic.Int64
	steps   atomic.Int64
}

func (r *extendBlip) Extend(ctx context.Context, l guard.Lease, d time.Duration) error {
	if r.blip.Swap(false) {
		return fmt.Errorf("%w: no answer within the bound", guard.ErrUnavailable)
	}
	r.extends.Add(1)
	return r.RedisStore.Extend(ctx, l, d)
}

func (r *extendBlip) SaveStep(ctx context.Context, l guard.Lease, i int, st guard.StepResult) error {
	r.steps.Add(1)
	return r.RedisStore.SaveStep(ctx, l, i, st)
}

// TestOneExtendBlipKeepsLeaseInPrimary: one Extend of a primary lease that
// the primary did not answer (over backstop.Wrap on the secondary's
// tables, the order the package documents) is written to the secondary,
// whose record is the holder's mark, as doc.go says; the holder's later
// writes go to the primary again. The Store remembered the lease as the
// secondary's (owners.hold), and every later write skipped the primary for
// good: its lease there was never extended again, and its steps were kept
// only in the secondary, where a recovery through the primary never sees
// them (Wrap's claims answer the primary's steps), so a step whose effect
// ran ran again (found by review).
func TestOneExtendBlipKeepsLeaseInPrimary(t *testing.T) {
	db := pgenv.Migrated(t, pgstore.Options{})
	rs := &extendBlip{RedisStore: guardenv.Store(t, guard.RedisOptions{})}
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, backstop.Wrap(rs, b), fallback.Options{Policy: fallback.Secondary,
		Secondary: pgenv.Store(t, db, pgstore.Options{}), Timeout: 3 * time.Second, Logger: quiet})
	k := guard.Key{Scope: "extend-blip", ID: t.Name()}
	out, err := s.Claim(bg, guard.ClaimRequest{Key: k, Token: "A", Fingerprint: "fp", Lease: 2 * time.Second, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	// One extension the primary does not answer; the breaker stays closed.
	rs.blip.Store(true)
	_ = s.Extend(bg, out.Lease, 2*time.Second)
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("breaker %v after one uncounted Extend", st)
	}
	// The primary answers again: the holder's next writes must reach it.
	if err := s.Extend(bg, out.Lease, 2*time.Second); err != nil {
		t.Fatalf("second Extend: %v", err)
	}
	if err := s.SaveStep(bg, out.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("charged")}); err != nil {
		t.Fatalf("SaveStep: %v", err)
	}
	rec, err := rs.RedisStore.Get(bg, k)
	if err != nil {
		t.Fatal(err)
	}
	if rs.extends.Load() == 0 || rs.steps.Load() == 0 || len(rec.Steps) != 1 {
		t.Errorf("after one Extend blip, the primary answering again got %d Extends and %d steps of its own lease "+
			"(record: %s, %d steps, lease left %s): the holder's writes are routed to the secondary for good",
			rs.extends.Load(), rs.steps.Load(), rec.State, len(rec.Steps), rec.LeaseLeft)
	}
	// The holder dies. A retry recovering the key once the leases ran out
	// must be told the step it recorded, or the charge runs again.
	var again guard.Outcome
	sec := pgenv.Store(t, db, pgstore.Options{})
	defer func() {
		t.Logf("last recovery answer: %+v, %v", again, err)
		r1, e1 := rs.RedisStore.Get(bg, k)
		t.Logf("redis: %s tok %s fence %d att %d left %s steps %d %v", r1.State, r1.Token, r1.Fence, r1.Attempt, r1.LeaseLeft, len(r1.Steps), e1)
		r2, e2 := sec.Get(bg, k)
		t.Logf("pg: %s tok %s fence %d att %d left %s steps %d %v", r2.State, r2.Token, r2.Fence, r2.Attempt, r2.LeaseLeft, len(r2.Steps), e2)
	}()
	n := 0
	waitFor(t, 10*time.Second, "a recovery claim", func() bool {
		n++
		again, err = s.Claim(bg, guard.ClaimRequest{Key: k, Token: fmt.Sprintf("B%d", n), Fingerprint: "fp", Lease: 2 * time.Second, TTL: time.Hour})
		return err == nil && again.Status == guard.Acquired
	})
	if len(again.Steps) != 1 {
		t.Fatalf("recovery = %s with steps %v; want the recorded step \"charge\" (its effect would run again)", again.Status, again.Steps)
	}
}
