package storetest

import (
	"errors"
	"testing"

	"github.com/idemguard/idemguard/guard"
)

// unchangedExpiry: a record nobody changes expires (docs/design.md, "The
// state machine": "pending after lease + TTL, failed after TTL ...
// → absent"), and the key's next claim is a first attempt again (rule 4:
// "A record that expired entirely starts again at 1"): not recovered, its
// attempts counted from naught. Retention asks it of a completed record;
// a store that kept an abandoned claim or a failure for ever would keep
// every key it ever failed exhausted. Leaving more time than that only
// makes a record more expired, so nothing here needs a call on time.
func (c contract) unchangedExpiry(t *testing.T) {
	s := c.h.New(t)
	pending, failed, shortened := newKey(t), newKey(t), newKey(t)
	// A lease its holder extended to end sooner than its claim's: the
	// record is kept for the claim's TTL after the new end, as after any
	// other (Extend pushes the end out from now: the stores kept the
	// later of the two records' ends, and the next claim met a dead
	// holder's record long after its retention).
	r := c.req(shortened, "A")
	r.Lease, r.TTL = 10*c.h.Lease, c.h.TTL
	sh := acquire(t, s, r)
	mustOK(t, "extend to a shorter lease", s.Extend(ctx, sh, c.h.Lease))
	r = c.req(pending, "A")
	r.TTL = c.h.TTL
	p := acquire(t, s, r)
	f := acquire(t, s, c.req(failed, "A"))
	mustOK(t, "fail", s.Fail(ctx, f, "boom", c.h.TTL))
	c.h.Advance(t, c.h.TTL)
	if rec, err := s.Get(ctx, failed); !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("Get of a failed record after its retention = %+v, %v; want ErrNotFound", rec, err)
	}
	c.h.Advance(t, c.h.Lease) // the pending records' leases and their retention are over
	for _, k := range []guard.Key{pending, shortened} {
		if rec, err := s.Get(ctx, k); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("Get of an abandoned pending record (%s) after its lease and retention = %+v, %v; want ErrNotFound", k, rec, err)
		}
	}
	for _, k := range []struct {
		name string
		key  guard.Key
		was  guard.Lease
	}{{"failed", failed, f}, {"pending", pending, p}, {"pending, its lease extended shorter,", shortened, sh}} {
		r := c.req(k.key, "B")
		r.MaxAttempts = 1
		if l := acquire(t, s, r); l.Attempt != 1 || l.Recovered || !c.firstFence(l.Fence, k.was.Fence) {
			t.Errorf("claim after the %s record expired = %+v, want attempt 1, not recovered, %s", k.name, l, c.firstFenceWant(k.was.Fence))
		}
	}
}
