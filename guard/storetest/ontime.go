package storetest

import (
	"testing"
	"time"
)

// onTimeRounds is how many rounds onTime tries, each with a lease twice
// the one before: 1, 2, 4 and 8 times Harness.Lease.
const onTimeRounds = 4

// onTime runs round, a case whose store calls must reach the store inside
// a span of real time (a record kept for its lease and retention, a lease
// not yet run out), with Harness.Lease and then, as long as round reports
// it was late, with leases 2, 4 and 8 times as long. On a real server a
// loaded machine can hold a call back past such a span; the store is then
// right to answer as it did and the round proves nothing, so it is run
// again, not passed. A round that was not late checks every answer as
// strictly as ever: a store breaking the contract fails the round that
// finds it. Every round late fails the test (a machine 8 leases behind).
func (c contract) onTime(t *testing.T, round func(lease time.Duration) (late bool)) {
	t.Helper()
	lease := c.h.Lease
	for i := range onTimeRounds {
		if !round(lease) {
			return
		}
		t.Logf("round %d (lease %s) was too late to prove anything; again with a lease of %s", i+1, lease, 2*lease)
		lease *= 2
	}
	t.Fatalf("%d rounds, leases up to %s, were all too late to prove anything", onTimeRounds, lease/2)
}

// late reports whether a call that has just returned may have reached
// the store span or more after began (on the store's clock, which real
// servers share with this process): only if not does its answer prove
// what the store must do within span of began. On a harness moving a
// manual clock, little real time passes and late is false.
func late(began time.Time, span time.Duration) bool {
	return time.Since(began) >= span
}
