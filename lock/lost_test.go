package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// Two of three nodes die while fn runs, so the lock's validity runs out
// (no extension reaches a quorum) and its release cannot reach a quorum
// either: Do's error matches ErrLost though fn returned nil, whether the
// caller's context is live or was cancelled first (a request that timed
// out while fn went on). With the context cancelled first, the loss was
// dropped: cancelling fn's context again recorded nothing, and Do
// returned nil.
func TestLossReportedWhateverTheCallersContext(t *testing.T) {
	const expiry = 600 * time.Millisecond
	for _, cancelFirst := range []bool{false, true} {
		name := "context live"
		if cancelFirst {
			name = "context cancelled first"
		}
		t.Run(name, func(t *testing.T) {
			servers, nodes := ownNodes(t, 3)
			l := newLocker(t, nodes, lock.Options{Expiry: expiry, TimeoutFactor: 0.2, RetryDelay: 10 * time.Millisecond})
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			err := l.Do(ctx, "x", func(fctx context.Context) error {
				if cancelFirst {
					cancel()
				}
				servers[1].Kill()
				servers[2].Kill()
				k := lock.FromContext(fctx)
				testenv.WaitFor(t, 10*expiry, "the lock's validity to run out", func() bool { return !time.Now().Before(k.Until()) })
				return nil
			})
			if !errors.Is(err, lock.ErrLost) {
				t.Fatalf("Do = %v, want ErrLost: the lock's validity ran out while fn ran", err)
			}
		})
	}
}
