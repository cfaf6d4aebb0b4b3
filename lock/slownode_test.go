package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/lock"
)

// TestFencedDoKeepsLockWithSlowNode: one node of three takes every call
// to its per-round timeout (CLIENT PAUSE: it accepts but does not answer,
// as behind a partition that drops packets). Redlock tolerates that, and
// so must Do with Fencing: its acquisition and two fence rounds each wait
// the round's full timeout, so the first extension has to come sooner
// than Expiry/3 after fn starts, or the lock's validity runs out before
// it lands and fn's context is cancelled with ErrLost although the
// lock was never in danger. TimeoutFactor 0.2 and DriftFactor 0.01 are
// allowed (their sum is below 1/3).
func TestFencedDoKeepsLockWithSlowNode(t *testing.T) {
	// The rounds take 0.8 of Expiry and the validity is 0.99 of it: the
	// 0.19 left (380ms) is what a loaded machine may add to the rounds and
	// the timers. At 600ms (114ms left) the validity ran out under load.
	const expiry = 2 * time.Second
	servers, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{Expiry: expiry, TimeoutFactor: 0.2, Fencing: true, RetryDelay: 10 * time.Millisecond})
	// The server is killed when the test ends; no need to unpause.
	if err := servers[0].Client().Do(bg, "CLIENT", "PAUSE", 20000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	// A loaded machine can miss a round's per-node timeout (400 ms) on the
	// two live nodes too: ErrUnavailable is then asked again, a few times,
	// and never skipped.
	var err error
	for try := 0; try < 5; try++ {
		err = l.Do(ctx, "slow", func(ctx context.Context) error {
			hold := time.NewTimer(2 * expiry) // the section outlives its first validity
			defer hold.Stop()
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-hold.C:
				return nil
			}
		})
		if !errors.Is(err, lock.ErrUnavailable) {
			break
		}
	}
	if err != nil {
		t.Fatalf("Do with one slow node of three = %v, want nil", err)
	}
}
