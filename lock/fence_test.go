package lock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// TestFenceGrows: with Fencing, every holder's fence is greater than the
// one before it, in the order the holders entered the section, across 3
// processes racing for the lock.
func TestFenceGrows(t *testing.T) {
	const procs, perProc, rounds = 3, 4, 4
	prefix := testenv.Prefix(t)
	var (
		sec    section
		fences []int64 // appended inside the section only
		wg     sync.WaitGroup
	)
	errs := make(chan error, procs*perProc)
	t.Cleanup(func() { // fence counters never expire: drop this test's
		for _, c := range redlockNodes(t) {
			_ = c.Del(bg, prefix+"acct:fence").Err()
		}
	})
	for range procs {
		l := newLocker(t, redlockNodes(t), lock.Options{Prefix: prefix, Fencing: true, RetryDelay: 10 * time.Millisecond})
		for range perProc {
			wg.Go(func() {
				for range rounds {
					err := l.Do(bg, "acct", func(ctx context.Context) error {
						sec.enter()
						defer sec.exit()
						fences = append(fences, lock.FromContext(ctx).Fence())
						return nil
					})
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sec.check(t)
	if len(fences) != procs*perProc*rounds {
		t.Fatalf("%d fences", len(fences))
	}
	for i, f := range fences {
		if f != int64(i+1) {
			t.Fatalf("fence #%d is %d, want %d (all: %v)", i, f, i+1, fences)
		}
	}
}

// TestFenceSurvivesNodeLoss: the fence keeps growing while one node at a
// time is down, and after a node comes back empty: any two quorums share
// a node that remembers the highest fence.
func TestFenceSurvivesNodeLoss(t *testing.T) {
	servers, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{Fencing: true, RetryDelay: 10 * time.Millisecond})
	var last int64
	take := func(step string) {
		t.Helper()
		k, err := l.Obtain(bg, "f")
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if k.Fence() <= last {
			t.Fatalf("%s: fence %d after %d", step, k.Fence(), last)
		}
		last = k.Fence()
		if err := k.Release(bg); err != nil {
			t.Fatalf("%s: release: %v", step, err)
		}
	}
	take("all up")
	take("all up again")
	servers[0].Kill()
	take("node 0 down")
	take("node 0 down again")
	servers[0].Restart() // empty: its counter is gone
	servers[1].Kill()    // the quorum is now node 0 (empty) and node 2
	take("node 0 empty, node 1 down")
	servers[1].Restart()
	servers[2].Kill() // nodes 0 and 1 restarted empty, but node 0 holds the last fence
	take("nodes 0, 1 restarted, node 2 down")
	if last != 6 {
		t.Fatalf("last fence %d, want 6 (one per acquisition)", last)
	}
}

func TestFenceOff(t *testing.T) {
	l := newLocker(t, redlockNodes(t), lock.Options{})
	if lock.FromContext(bg) != nil {
		t.Fatal("FromContext of a bare context is not nil")
	}
	err := l.Do(bg, "plain", func(ctx context.Context) error {
		k := lock.FromContext(ctx)
		if k == nil || k.Name() != "plain" || k.Fence() != 0 || !k.Until().After(time.Now()) {
			t.Errorf("FromContext in Do = %+v", k)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
