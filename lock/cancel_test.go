package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// TestCancelWhileAcquiringRunsNothing: a caller's context is cancelled
// while its acquisition is under way (one node of three paused, so the
// attempt waits out its per-node timeout after the live nodes took the
// key). The attempt completes, so that it leaves nothing behind, but the
// caller has gone: Do must return the context's error without running fn,
// Obtain must return it without a lock, and the key must be released on
// every live node, not left until Expiry. Before, fn ran with a done
// context and Obtain handed back the lock.
func TestCancelWhileAcquiringRunsNothing(t *testing.T) {
	const expiry = 2 * time.Second // a round waits 400 ms for the paused node
	servers, nodes := ownNodes(t, 3)
	prefix := testenv.Prefix(t)
	l := newLocker(t, nodes, lock.Options{Prefix: prefix, Expiry: expiry, TimeoutFactor: 0.2, Fencing: true, RetryDelay: 10 * time.Millisecond})
	// The server is killed when the test ends; no need to unpause.
	if err := servers[0].Client().Do(bg, "CLIENT", "PAUSE", 30000, "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	key := prefix + "acct"
	for _, via := range []string{"Do", "Obtain"} {
		t.Run(via, func(t *testing.T) {
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			type answer struct {
				ran bool
				k   *lock.Lock
				err error
			}
			done := make(chan answer, 1)
			go func() {
				var a answer
				if via == "Do" {
					a.err = l.Do(ctx, "acct", func(context.Context) error { a.ran = true; return nil })
				} else {
					a.k, a.err = l.Obtain(ctx, "acct")
				}
				done <- a
			}()
			// The live nodes took the key: the attempt now waits for the
			// paused one.
			testenv.WaitFor(t, 10*time.Second, "the attempt to take the key on the live nodes", func() bool {
				n, err := nodes[1].Exists(bg, key).Result()
				return err == nil && n == 1
			})
			cancel()
			a := <-done
			if a.ran {
				t.Error("fn ran for a caller whose context had ended")
			}
			if a.k != nil {
				_ = a.k.Release(bg)
				t.Error("Obtain returned a lock to a caller whose context had ended")
			}
			if !errors.Is(a.err, context.Canceled) {
				t.Errorf("err = %v, want one matching context.Canceled", a.err)
			}
			for i := 1; i < 3; i++ {
				if n, err := nodes[i].Exists(bg, key).Result(); err != nil || n != 0 {
					t.Errorf("node %d: EXISTS %s = %d, %v once the call returned: the lock was left taken", i, key, n, err)
				}
			}
		})
	}
}
