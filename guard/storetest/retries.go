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
	// retried runs write, sent again by a former holder, and checks that
	// it changed nothing of the record the current holder keeps.
	retried := func(key guard.Key, holder guard.Lease, what string, write func() error) {
		t.Helper()
		before := get(t, s, key)
		if before.State != guard.StatePending || before.Token != holder.Token {
			t.Fatalf("before %s: %+v, want pending for %s", what, before, holder.Token)
		}
		mustOK(t, what, write())
		after := get(t, s, key)
		if after.State != before.State || after.Token != before.Token || after.Fence != before.Fence ||
			after.Attempt != before.Attempt || after.LastError != before.LastError {
			t.Fatalf("%s changed the record: before %+v, after %+v", what, before, after)
		}
	}

	// A failure, retried after the next attempt took the key.
	key := newKey(t)
	a := acquire(t, s, c.req(key, "A"))
	mustOK(t, "fail", s.Fail(ctx, a, "boom", time.Hour))
	b := acquire(t, s, c.req(key, "B"))
	retried(key, b, "fail sent again after B took the key", func() error { return s.Fail(ctx, a, "boom", time.Hour) })
	mustLost(t, "complete by the former holder", s.Complete(ctx, a, []byte("a"), time.Hour))

	// A release of a later attempt, retried after the next one took the key.
	mustOK(t, "release of attempt 2", s.Release(ctx, b))
	c3 := acquire(t, s, c.req(key, "C"))
	retried(key, c3, "release of attempt 2 sent again after C took the key", func() error { return s.Release(ctx, b) })

	// A release of a first attempt (the key reads as absent), retried
	// after a new first attempt took the key.
	key2 := newKey(t)
	a2 := acquire(t, s, c.req(key2, "A"))
	mustOK(t, "release of a first attempt", s.Release(ctx, a2))
	b2 := acquire(t, s, c.req(key2, "B"))
	retried(key2, b2, "release of the first attempt sent again after B took the key", func() error { return s.Release(ctx, a2) })
	mustOK(t, "B completes", s.Complete(ctx, b2, []byte("b"), time.Hour))
	if out := claim(t, s, c.req(key2, "D")); out.Status != guard.Replay || string(out.Result) != "b" {
		t.Fatalf("after the retried release = %+v, want replay of b", out)
	}
}

// claimResentAfterItsEnd: a copy of a claim that reaches the store after
// its holder ended the claim (a client re-sends a claim whose reply it
// lost; a delayed copy can land after the holder failed or released it)
// takes nothing: it answers InProgress, the record stays as it is, and the
// next claim takes the key over with the next fence and attempt, as if
// the claim had been made once (docs/design.md, "The state machine",
// rule 2).
func (c contract) claimResentAfterItsEnd(t *testing.T) {
	s := c.h.New(t)
	for _, end := range []string{"fail", "release"} {
		t.Run(end, func(t *testing.T) {
			key := newKey(t)
			first := acquire(t, s, c.req(key, "A"))
			mustOK(t, "fail A", s.Fail(ctx, first, "x", time.Hour))
			b := c.req(key, "B")
			taken := acquire(t, s, b) // a second attempt: its release leaves the record failed
			if end == "fail" {
				mustOK(t, "fail B", s.Fail(ctx, taken, "y", time.Hour))
			} else {
				mustOK(t, "release B", s.Release(ctx, taken))
			}
			before := get(t, s, key)
			if out, err := s.Claim(ctx, b); err != nil || out.Status != guard.InProgress {
				t.Errorf("claim B sent again after its %s: %v (fence %d attempt %d), %v; want in progress, nothing taken",
					end, out.Status, out.Lease.Fence, out.Lease.Attempt, err)
			}
			after := get(t, s, key)
			if after.State != before.State || after.Fence != before.Fence || after.Attempt != before.Attempt || after.Token != before.Token {
				t.Errorf("record after the copy: %+v; want it as before: %+v", after, before)
			}
			next := acquire(t, s, c.req(key, "C"))
			if next.Fence <= before.Fence || next.Attempt != before.Attempt+1 {
				t.Errorf("next claim: fence %d attempt %d, want above %d and %d", next.Fence, next.Attempt, before.Fence, before.Attempt+1)
			}
		})
	}
}
