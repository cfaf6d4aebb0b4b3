package storetest

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// retriedAfterTakeover: a fail or release whose first copy took effect,
// sent again after another claim took the key over, answers OK and
// changes nothing (docs/design.md, "The state machine", rule 2: the record
// keeps the previous holder's token as ptok). A client library re-sends a
// write whose reply it lost; answering ErrLeaseLost there tells the caller
// its failure or release did not happen, when it did.
func (c contract) retriedAfterTakeover(t *testing.T) {
	s := c.h.New(t)
	unchanged := func(key guard.Key, want guard.Lease) {
		t.Helper()
		rec := get(t, s, key)
		if rec.State != guard.StatePending || rec.Token != want.Token || rec.Fence != want.Fence || rec.Attempt != want.Attempt {
			t.Fatalf("a retried write of a former holder changed the record: %+v, want pending for %s with fence %d, attempt %d",
				rec, want.Token, want.Fence, want.Attempt)
		}
	}

	// A failure, retried after the next attempt took the key.
	key := newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	mustOK(t, "fail", s.Fail(ctx, a, "boom", time.Hour))
	b := acquire(t, s, c.req(key, "B"))
	mustOK(t, "fail sent again after B took the key", s.Fail(ctx, a, "boom", time.Hour))
	unchanged(key, b)
	mustLost(t, "complete by the former holder", s.Complete(ctx, a, []byte("a"), time.Hour))
	unchanged(key, b)

	// A release of a later attempt, retried after the next one took the key.
	mustOK(t, "release of attempt 2", s.Release(ctx, b))
	c3 := acquire(t, s, c.req(key, "C"))
	mustOK(t, "release of attempt 2 sent again after C took the key", s.Release(ctx, b))
	unchanged(key, c3)

	// A release of a first attempt (the key reads as absent), retried
	// after a new first attempt took the key.
	key2 := newKey(t)
	a2 := acquire(t, s, c.req(key2, "A"))
	mustOK(t, "release of a first attempt", s.Release(ctx, a2))
	b2 := acquire(t, s, c.req(key2, "B"))
	mustOK(t, "release of the first attempt sent again after B took the key", s.Release(ctx, a2))
	unchanged(key2, b2)
	mustOK(t, "B completes", s.Complete(ctx, b2, []byte("b"), time.Hour))
	if out := claim(t, s, c.req(key2, "D")); out.Status != guard.Replay || string(out.Result) != "b" {
		t.Fatalf("after the retried release = %+v, want replay of b", out)
	}
}
