package storetest

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// mismatchEveryState: a claim with another fingerprint is a mismatch in
// every state the record can be in, and learns nothing else about it
// (docs/design.md, "The state machine", rule 3: "refused before anything
// else about the record is revealed"): not that the holder died and the key
// could be taken (a pending record whose lease ran out: taking it over
// would run another payload's effect under this key, with the first
// payload's steps), not that its attempts ran out (Exhausted with their
// count and the last failure's reason). The answer carries nothing but the
// status, and the record stays as it was: the next claim with the record's
// own fingerprint finds it as the mismatch left it. (a mutation review: a
// memstore answering Exhausted before comparing fingerprints, or comparing
// them only while a lease is alive, passed the contract.)
func (c contract) mismatchEveryState(t *testing.T) {
	s := c.h.New(t)
	type keyed struct {
		name string
		key  guard.Key
		max  int // the MaxAttempts of the mismatching claim
	}
	var keys []keyed
	// The keys whose lease must run out come first, before one Advance.
	expired, expiredLast := newKey(t), newKey(t)
	acquire(t, s, c.req(expired, "A"))
	acquire(t, s, c.req(expiredLast, "A"))
	c.h.Advance(t, c.h.Lease) // both holders died
	keys = append(keys, keyed{"pending, lease run out", expired, 0},
		keyed{"pending, lease run out on the last attempt", expiredLast, 1})

	live, failed, exhausted, completed := newKey(t), newKey(t), newKey(t), newKey(t)
	long := c.req(live, "A")
	long.Lease = heldLease
	acquire(t, s, long)
	acquire(t, s, c.req(failed, "A"))
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: failed, Token: "A"}, "secret reason", time.Hour))
	acquire(t, s, c.req(exhausted, "A"))
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: exhausted, Token: "A"}, "secret reason", time.Hour))
	acquire(t, s, c.req(completed, "A"))
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: completed, Token: "A"}, []byte("secret"), time.Hour))
	keys = append(keys, keyed{"pending, lease alive", live, 0}, keyed{"failed, attempts left", failed, 0},
		keyed{"failed, attempts used up", exhausted, 1}, keyed{"completed", completed, 1})

	for _, k := range keys {
		before := get(t, s, k.key)
		r := c.req(k.key, "B")
		r.Fingerprint, r.MaxAttempts = "another payload", k.max
		out := claim(t, s, r)
		if out.Status != guard.Mismatch || out.Lease != (guard.Lease{}) || out.Result != nil || out.LeaseLeft != 0 ||
			out.Attempts != 0 || out.LastError != "" || out.Steps != nil {
			t.Errorf("%s: claim with another fingerprint = %+v, want a mismatch and nothing else", k.name, out)
			continue
		}
		after := get(t, s, k.key)
		if after.State != before.State || after.Token != before.Token || after.Fence != before.Fence ||
			after.Attempt != before.Attempt || after.LastError != before.LastError || after.Fingerprint != before.Fingerprint {
			t.Errorf("%s: the mismatch changed the record: before %+v, after %+v", k.name, before, after)
		}
	}
	// The dead holder's key is still there to recover for its own payload.
	if l := acquire(t, s, c.req(expired, "C")); l.Fence != 2 || l.Attempt != 2 || !l.Recovered {
		t.Errorf("claim with the record's fingerprint after the mismatch = %+v, want fence 2, attempt 2, recovered", l)
	}
}
