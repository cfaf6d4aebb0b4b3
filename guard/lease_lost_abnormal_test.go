package guard_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestLeaseLostOnceOnAbnormalEnd: a holder whose key was taken over
// while its effect ran loses its lease once, and the heartbeat observes
// it; when the effect then panics (Do) or calls runtime.Goexit (DoBatch,
// on the caller's goroutine), the release that ends the claim is refused
// for the same loss, and is not observed as a second EventLeaseLost (it
// was: TestLeaseLostObservedOnce covers effects that return).
func TestLeaseLostOnceOnAbnormalEnd(t *testing.T) {
	rdb := testenv.Redis(t)
	s := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	other := guard.New(s, guard.Options{Lease: 10 * time.Second})
	// takeOver gives key to another holder and waits for the heartbeat to
	// find the lease lost.
	takeOver := func(ctx context.Context, key guard.Key) {
		if err := rdb.Del(ctx, s.Name(key)).Err(); err != nil {
			t.Error(err)
		}
		if _, err := other.Claim(context.Background(), key, "fp"); err != nil {
			t.Error(err)
		}
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), guard.ErrLeaseLost) {
			t.Errorf("cause %v, want ErrLeaseLost", context.Cause(ctx))
		}
	}
	calls := map[string]func(g *guard.Guard, key guard.Key){
		"DoPanic": func(g *guard.Guard, key guard.Key) {
			defer func() { _ = recover() }()
			_, _ = g.Do(bg, key, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
				takeOver(ctx, key)
				panic("boom")
			})
		},
		"DoBatchGoexit": func(g *guard.Guard, key guard.Key) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				g.DoBatch(bg, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, _ guard.Lease) ([]byte, error) {
					takeOver(ctx, key)
					runtime.Goexit()
					return nil, nil
				}, guard.BatchOptions{})
			}()
			<-done
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			observer, lost := lossCounter(t)
			g := guard.New(s, guard.Options{Lease: 300 * time.Millisecond, Observer: observer})
			call(g, guard.Key{Scope: "lost-abnormal", ID: name})
			if n := lost.Load(); n != 1 {
				t.Errorf("one lease lost once, observed %d times", n)
			}
		})
	}
}
