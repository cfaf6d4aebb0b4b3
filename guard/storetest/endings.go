package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// recoveredKept: a record reached by recovering an expired lease says so
// (guard.Record.Recovered) after its holder completes or fails it, not
// only while it is pending.
func (c contract) recoveredKept(t *testing.T) {
	s := c.h.New(t)
	for _, end := range []struct {
		name  string
		state guard.State
		write func(guard.Lease) error
	}{
		{"complete", guard.StateCompleted, func(l guard.Lease) error { return s.Complete(ctx, l, []byte("b"), time.Hour) }},
		{"fail", guard.StateFailed, func(l guard.Lease) error { return s.Fail(ctx, l, "boom", time.Hour) }},
	} {
		key := newKey(t)
		acquire(t, s, c.req(key, "A"))
		c.h.Advance(t, c.h.Lease) // A stops heartbeating: it crashed
		b := acquire(t, s, c.req(key, "B"))
		if !b.Recovered {
			t.Fatalf("lease after A's ran out = %+v, want recovered", b)
		}
		mustOK(t, end.name, end.write(b))
		if rec := get(t, s, key); rec.State != end.state || !rec.Recovered || rec.Fence != 2 {
			t.Errorf("record after the recovered holder's %s = %+v, want %v, fence 2, recovered", end.name, rec, end.state)
		}
	}
}

// exhaustedByExpiry: a claim that finds the last attempt's lease run out
// answers Exhausted and records it: the record becomes failed with the
// reason "lease expired", so Get and every later claim agree, and the dead
// holder, should it wake, can no longer complete a key its callers were
// told is exhausted.
func (c contract) exhaustedByExpiry(t *testing.T) {
	s, key := c.h.New(t), newKey(t)
	r := c.req(key, "A")
	r.MaxAttempts = 1
	a := acquire(t, s, r)
	c.h.Advance(t, c.h.Lease) // A stops heartbeating
	r.Token = "B"
	if out := claim(t, s, r); out.Status != guard.Exhausted || out.Attempts != 1 || out.LastError != "lease expired" {
		t.Fatalf("claim after the only attempt's lease ran out = %+v, want exhausted after 1, lease expired", out)
	}
	if rec := get(t, s, key); rec.State != guard.StateFailed || rec.LastError != "lease expired" || rec.Attempt != 1 || rec.Fence != 1 {
		t.Fatalf("record after the exhausting claim = %+v, want failed at fence 1, attempt 1, lease expired", rec)
	}
	mustLost(t, "the dead holder's complete", s.Complete(ctx, a, []byte("late"), time.Hour))
	if out := claim(t, s, r); out.Status != guard.Exhausted || out.LastError != "lease expired" {
		t.Fatalf("claim again = %+v, want exhausted, lease expired", out)
	}
}

// batchRetention: completions written together by WriteBatch keep their
// records for the retention each gave, as Complete does (Retention).
func (c contract) batchRetention(t *testing.T) {
	// Each Get must reach the store within the retention the batch gave:
	// onTime runs again with a longer one (as much longer as the lease)
	// when one did not.
	c.onTime(t, func(lease time.Duration) bool {
		ttl := c.h.TTL * (lease / c.h.Lease)
		s := c.h.New(t)
		bs := batchStore(t, s)
		ws := make([]guard.Write, 3)
		for i := range ws {
			ws[i] = guard.Write{Kind: guard.WriteComplete, Lease: acquire(t, s, c.req(newKey(t), "A")), Result: []byte("r"), TTL: ttl}
		}
		completed := time.Now()
		for i, err := range bs.WriteBatch(ctx, ws) {
			mustOK(t, fmt.Sprintf("complete %d", i), err)
		}
		for _, w := range ws {
			rec, err := s.Get(ctx, w.Lease.Key)
			if (errors.Is(err, guard.ErrNotFound) || err == nil && rec.TTL <= 0) && late(completed, ttl) {
				return true
			}
			if err != nil || rec.State != guard.StateCompleted || rec.TTL <= 0 || rec.TTL > ttl {
				t.Fatalf("record completed in a batch = %+v, %v; want completed with a TTL in (0, %s]", rec, err, ttl)
			}
		}
		c.h.Advance(t, ttl)
		for _, w := range ws {
			if _, err := s.Get(ctx, w.Lease.Key); !errors.Is(err, guard.ErrNotFound) {
				t.Fatalf("Get after the retention = %v, want ErrNotFound", err)
			}
		}
		return false
	})
}

// stepAfterOwnFailure: a holder that failed its attempt holds the key no
// longer (StepStore: a compare-and-set on the owner token of a pending
// record): a step it sends after its Fail, before any other claim, is
// ErrLeaseLost and stores nothing, a step the record holds sent again
// included.
func (c contract) stepAfterOwnFailure(t *testing.T) {
	if !guard.KeepsSteps(c.h.New(t)) {
		t.Skip("the store keeps no steps")
	}
	s, key := stepStore(t, c), newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	save(t, s, a, 0, step("a", "1"))
	mustOK(t, "fail", s.Fail(ctx, a, "boom", time.Hour))
	mustLost(t, "the failed holder's next step", s.SaveStep(ctx, a, 1, step("b", "2")))
	mustLost(t, "the failed holder's step sent again", s.SaveStep(ctx, a, 0, step("a", "1")))
	rec := get(t, s, key)
	if rec.State != guard.StateFailed {
		t.Fatalf("record = %+v, want failed", rec)
	}
	wantSteps(t, "failed record", rec.Steps, step("a", "1"))
}

// endings: how a holder's attempt ends, and what the record then says.
func (c contract) endings(t *testing.T) {
	c.run(t, []testCase{
		{"RecoveredKept", c.recoveredKept},
		{"ExhaustedByExpiry", c.exhaustedByExpiry},
		{"StepAfterOwnFailure", c.stepAfterOwnFailure},
		{"BatchRetention", c.batchRetention},
	})
}
