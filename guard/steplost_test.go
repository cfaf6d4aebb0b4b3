package guard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestStepLeaseLostEndsEffect: a Step whose write finds the lease lost
// (the store no longer holds the holder's record: Redis lost it, or an
// operator failed the claim and another holder took the key) has found
// the lease lost, and the effect's context ends then, as the docs of
// Func, BatchFunc, Held.Context and KeepAlive say ("as soon as the lease
// is found lost"), not at the heartbeat's next extension, a third of a
// lease later, while work the effect left running goes on beside the next
// holder. And one lost lease is one EventLeaseLost, though the write that
// ends the run is refused too. The lease is long, so the heartbeat is not
// what finds the loss within the test.
func TestStepLeaseLostEndsEffect(t *testing.T) {
	rdb := testenv.Redis(t)
	s := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	for _, via := range []string{"Do", "Hold", "Keep", "DoBatch"} {
		t.Run(via, func(t *testing.T) {
			var lost atomic.Int64
			g := guard.New(s, guard.Options{Lease: 30 * time.Second, Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
				if e.Kind == guard.EventLeaseLost {
					lost.Add(1)
				}
			})})
			key := guard.Key{Scope: "step-lost", ID: via + "-" + time.Now().Format(time.RFC3339Nano)}
			var ctxLiveAfterLoss atomic.Bool
			effect := func(ctx context.Context, l guard.Lease) error {
				// The record goes (a failover lost it).
				if err := rdb.Del(ctx, s.Name(key)).Err(); err != nil {
					return err
				}
				_, err := guard.Step(ctx, l, "charge", func(context.Context) (string, error) { return "ch_1", nil })
				if !errors.Is(err, guard.ErrLeaseLost) {
					t.Errorf("step: %v, want ErrLeaseLost", err)
				}
				// Work of the effect that runs beside the step (a goroutine
				// streaming downstream) checks its context.
				ctxLiveAfterLoss.Store(ctx.Err() == nil)
				return err
			}
			switch via {
			case "Do":
				_, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
					return nil, effect(ctx, l)
				})
				if !errors.Is(err, guard.ErrLeaseLost) {
					t.Fatalf("Do: %v", err)
				}
			case "Hold":
				_, h, err := g.Hold(bg, key, "fp")
				if err != nil {
					t.Fatal(err)
				}
				_ = h.Fail(effect(h.Context(), h.Lease()))
			case "Keep":
				out, err := g.Claim(bg, key, "fp")
				if err != nil || out.Status != guard.Acquired {
					t.Fatalf("claim: %+v, %v", out, err)
				}
				h := g.Keep(bg, out.Lease)
				_ = h.Fail(effect(h.Context(), h.Lease()))
			case "DoBatch":
				res := g.DoBatch(bg, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, l guard.Lease) ([]byte, error) {
					return nil, effect(ctx, l)
				}, guard.BatchOptions{})
				if !errors.Is(res[0].Err, guard.ErrLeaseLost) {
					t.Fatalf("DoBatch: %v", res[0].Err)
				}
			}
			if ctxLiveAfterLoss.Load() {
				t.Errorf("the effect's context is still live after a Step found the lease lost")
			}
			if n := lost.Load(); n != 1 {
				t.Errorf("one lease lost, observed %d EventLeaseLost", n)
			}
		})
	}
}
