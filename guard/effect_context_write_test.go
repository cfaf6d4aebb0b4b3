package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// slowComplete answers Complete only when its context ends (a partition:
// a store that honours its context, which then reports the write
// unavailable).
type slowComplete struct {
	guard.Store
	entered chan struct{}
}

func (s *slowComplete) Complete(ctx context.Context, l guard.Lease, result []byte, ttl time.Duration) error {
	close(s.entered)
	<-ctx.Done()
	return ctx.Err()
}

// TestEffectContextEndsAtDeadlineDuringWrite: "its context is done
// before any other claim of the key can succeed" (docs/design.md) holds
// while the write that ends the claim is under way too, for Hold, Do and
// DoBatch: the effect's context ends at the lease's deadline though the
// write hangs. (It stayed live until the write returned, at its bound of
// max(Lease, 1s), while another holder had taken the key over.)
func TestEffectContextEndsAtDeadlineDuringWrite(t *testing.T) {
	const lease = 300 * time.Millisecond
	for _, name := range []string{"Hold", "Do", "DoBatch"} {
		t.Run(name, func(t *testing.T) {
			s := realStore(t)
			sc := &slowComplete{Store: s, entered: make(chan struct{})}
			g := guard.New(sc, guard.Options{Lease: lease})
			other := guard.New(s, guard.Options{Lease: 10 * time.Second})
			key := guard.Key{Scope: "writectx", ID: name}

			effect := make(chan context.Context, 1)
			wrote := make(chan error, 1)
			switch name {
			case "Hold":
				_, h, err := g.Hold(bg, key, "fp")
				if err != nil {
					t.Fatal(err)
				}
				effect <- h.Context()
				go func() { wrote <- h.Complete([]byte("v")) }()
			case "DoBatch":
				go func() {
					res := g.DoBatch(bg, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, _ guard.Lease) ([]byte, error) {
						effect <- ctx
						return []byte("v"), nil
					}, guard.BatchOptions{})
					wrote <- res[0].Err
				}()
			case "Do":
				go func() {
					_, err := g.Do(bg, key, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
						effect <- ctx // e.g. a goroutine the effect left behind
						return []byte("v"), nil
					})
					wrote <- err
				}()
			}
			ctx := <-effect
			<-sc.entered
			// Another holder takes the key over once the server's lease
			// has run out.
			if _, err := claimWhenFree(t, other, key, 3*time.Second, func(guard.Lease) {}); err != nil {
				t.Fatal(err)
			}
			// Give or take the timer's lateness on a loaded machine
			// (lateGrace, as in TestDoBatchDeadlineWhileExtensionHangs).
			const lateGrace = 100 * time.Millisecond
			if ctx.Err() == nil && !testenv.EndsWithin(ctx, lateGrace) {
				t.Errorf("another holder acquired the key while the first holder's effect context is still live (%s later)", lateGrace)
			} else if !errors.Is(context.Cause(ctx), guard.ErrLeaseLost) {
				t.Errorf("the effect's context ended with %v, want ErrLeaseLost", context.Cause(ctx))
			}
			<-wrote
		})
	}
}
