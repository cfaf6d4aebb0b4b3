package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// releaseRetention: a record that Release returns to failed (a later
// attempt, or one that recorded steps) is kept as long as its pending
// record would have been, its lease's end plus the claim's retention
// (docs/design.md, "The state machine": "failed after TTL (failed by a
// release: when its pending record would have) → absent"), no shorter:
// forgotten sooner, the key's next claim would be a first attempt again,
// with MaxAttempts counted from naught, steps lost, fence 1; and no longer.
// (a mutation review: a memstore keeping such a record for the minute a
// released first attempt's marker is kept passed the contract.)
func (c contract) releaseRetention(t *testing.T) {
	s := c.h.New(t)
	kept := func(what string, key guard.Key, atMost time.Duration) {
		t.Helper()
		rec := get(t, s, key)
		if rec.State != guard.StateFailed || rec.TTL <= 0 || rec.TTL > atMost || (atMost >= time.Hour && rec.TTL < 30*time.Minute) {
			t.Errorf("%s: %+v, want failed with a TTL within the pending record's (at most %s, with a retention of an hour at least 30m)",
				what, rec, atMost)
		}
	}
	// Retention of an hour: the released record is kept about an hour.
	key := newKey(t)
	acquire(t, s, c.req(key, "A"))
	mustOK(t, "fail A", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "boom", time.Hour))
	b := acquire(t, s, c.req(key, "B"))
	mustOK(t, "release B", s.Release(ctx, b))
	kept("a released later attempt", key, time.Hour+c.h.Lease)
	if guard.KeepsSteps(s) {
		ss, k2 := s.(guard.StepStore), newKey(t)
		a := acquire(t, s, c.req(k2, "A"))
		save(t, ss, a, 0, step("a", "1"))
		mustOK(t, "release A", s.Release(ctx, a))
		kept("a released first attempt with a step", k2, time.Hour+c.h.Lease)
	}

	// A short retention: the released record goes when its pending one
	// would have. Only the claims must reach the store in time.
	c.onTime(t, func(lease time.Duration) bool {
		ttl := c.h.TTL * (lease / c.h.Lease)
		key := newKey(t)
		r := c.req(key, "A")
		r.Lease, r.TTL = lease, time.Hour
		acquire(t, s, r)
		mustOK(t, "fail A", s.Fail(ctx, guard.Lease{Key: key, Token: "A"}, "boom", time.Hour))
		r.Token, r.TTL = "B", ttl
		began := time.Now()
		b := acquire(t, s, r)
		mustOK(t, "release B", s.Release(ctx, b))
		rec, err := s.Get(ctx, key)
		if errors.Is(err, guard.ErrNotFound) && late(began, lease+ttl) {
			return true
		}
		if err != nil || rec.State != guard.StateFailed || rec.TTL <= 0 || rec.TTL > lease+ttl {
			t.Fatalf("released later attempt = %+v, %v; want failed with a TTL in (0, %s]", rec, err, lease+ttl)
		}
		c.h.Advance(t, lease+ttl)
		if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("Get after the lease's end and the claim's retention = %v, want ErrNotFound", err)
		}
		return false
	})
}
