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

// TestLeaseLostOnceThroughSteps: one lost lease is one
// EventLeaseLost (promx's lease_lost counter, the Logger's line) also for
// a caller that runs the effect itself with the separate steps: Claim,
// then KeepAlive, Extend or a Step that finds the lease lost and
// observes it, then the Complete, Fail or Release that ends the claim,
// refused for that same loss. TestLeaseLostObservedOnce covers Do,
// DoBatch and Hold, whose writes know the heartbeat observed the loss;
// Guard.Complete, Fail and Release observed it a second time.
func TestLeaseLostOnceThroughSteps(t *testing.T) {
	rdb := testenv.Redis(t)
	s := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	ends := map[string]func(g *guard.Guard, l guard.Lease) error{
		"Complete": func(g *guard.Guard, l guard.Lease) error { return g.Complete(bg, l, []byte("late")) },
		"Fail":     func(g *guard.Guard, l guard.Lease) error { return g.Fail(bg, l, errors.New("boom")) },
		"Release":  func(g *guard.Guard, l guard.Lease) error { return g.Release(bg, l) },
	}
	// How the loss is found and observed before the write: by the
	// heartbeat of KeepAlive, or by a Step.
	finds := map[string]func(g *guard.Guard, l guard.Lease) error{
		"KeepAlive": func(g *guard.Guard, l guard.Lease) error {
			ctx, stop := g.KeepAlive(bg, l)
			defer stop()
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				return errors.New("KeepAlive's context did not end within 10s of the record's loss")
			}
			return context.Cause(ctx)
		},
		"Extend": func(g *guard.Guard, l guard.Lease) error { return g.Extend(bg, l) },
		"Step": func(g *guard.Guard, l guard.Lease) error {
			_, err := guard.Step(bg, l, "charge", func(context.Context) (string, error) { return "ok", nil })
			return err
		},
	}
	for fname, find := range finds {
		for ename, end := range ends {
			t.Run(fname+"/"+ename, func(t *testing.T) {
				var lost atomic.Int64
				g := guard.New(s, guard.Options{Lease: 300 * time.Millisecond, Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
					if e.Kind == guard.EventLeaseLost {
						lost.Add(1)
					}
				})})
				key := guard.Key{Scope: "obs-lease-lost-steps", ID: fname + "-" + ename + "-" + time.Now().Format(time.RFC3339Nano)}
				out, err := g.Claim(bg, key, "fp")
				if err != nil || out.Status != guard.Acquired {
					t.Fatalf("claim: %v %v", out.Status, err)
				}
				// Redis lost the record: the holder's lease is gone.
				if err := rdb.Del(bg, s.Name(key)).Err(); err != nil {
					t.Fatal(err)
				}
				if err := find(g, out.Lease); !errors.Is(err, guard.ErrLeaseLost) {
					t.Fatalf("%s: %v, want ErrLeaseLost", fname, err)
				}
				if n := lost.Load(); n != 1 {
					t.Fatalf("%s observed %d EventLeaseLost, want 1", fname, n)
				}
				// A release of a record that is gone finds nothing to
				// release (nil); the others are refused.
				if err := end(g, out.Lease); !errors.Is(err, guard.ErrLeaseLost) && (ename != "Release" || err != nil) {
					t.Fatalf("%s: %v, want ErrLeaseLost", ename, err)
				}
				if n := lost.Load(); n != 1 {
					t.Errorf("one lease lost once, observed %d times (the %s refused for the loss %s observed counted again)", n, ename, fname)
				}
			})
		}
	}
}
