package storetest

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// expiredLeaseStillHeld: a lease that ran out, unclaimed by anyone, still
// belongs to its holder (ExtendKeepsLease says so for Extend): its Complete
// is taken and replayed, its Fail recorded (the next claim a retry, not a
// recovery). The guard sends its completion before its deadline, and the
// write may reach the store after the lease's end; a store refusing it
// there would lose the result of an effect that ran, and the next delivery
// would run it again. (a mutation review: a memstore whose Complete also
// required a live lease passed the contract.)
func (c contract) expiredLeaseStillHeld(t *testing.T) {
	s := c.h.New(t)
	done, failed := newKey(t), newKey(t)
	d := acquire(t, s, c.req(done, "A"))
	f := acquire(t, s, c.req(failed, "A"))
	c.h.Advance(t, c.h.Lease) // both leases ran out; nobody claimed
	mustOK(t, "complete after the lease ran out, nobody took over", s.Complete(ctx, d, []byte("a"), time.Hour))
	if out := claim(t, s, c.req(done, "B")); out.Status != guard.Replay || string(out.Result) != "a" {
		t.Errorf("claim after the late completion = %+v, want replay of a", out)
	}
	mustOK(t, "fail after the lease ran out, nobody took over", s.Fail(ctx, f, "late", time.Hour))
	if rec := get(t, s, failed); rec.State != guard.StateFailed || rec.LastError != "late" {
		t.Errorf("record after the late fail = %+v, want failed with %q", rec, "late")
	}
	if l := acquire(t, s, c.req(failed, "B")); l.Attempt != 2 || l.Fence != 2 || l.Recovered {
		t.Errorf("claim after the late fail = %+v, want attempt 2, fence 2, not recovered", l)
	}
}
