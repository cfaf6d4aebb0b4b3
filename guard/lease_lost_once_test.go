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

// TestLeaseLostObservedOnce: a holder whose record vanishes while its
// effect runs (Redis lost it) loses its lease once, and the Observer hears
// one EventLeaseLost, the heartbeat's: the write that ends the run, refused
// for the same loss, adds none (promx counted each lost lease twice), and
// the heartbeat's is observed before the call returns. Through Do, DoBatch
// and Hold.
func TestLeaseLostObservedOnce(t *testing.T) {
	rdb := testenv.Redis(t)
	s := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	// lose deletes key's record and waits for the heartbeat to end ctx.
	lose := func(ctx context.Context, key guard.Key) error {
		if err := rdb.Del(ctx, s.Name(key)).Err(); err != nil {
			return err
		}
		<-ctx.Done()
		return context.Cause(ctx)
	}
	calls := map[string]func(g *guard.Guard, key guard.Key) error{
		"Do": func(g *guard.Guard, key guard.Key) error {
			_, err := g.Do(bg, key, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
				return nil, lose(ctx, key)
			})
			return err
		},
		"DoBatch": func(g *guard.Guard, key guard.Key) error {
			res := g.DoBatch(bg, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, _ guard.Lease) ([]byte, error) {
				return nil, lose(ctx, key)
			}, guard.BatchOptions{})
			return res[0].Err
		},
		"Hold": func(g *guard.Guard, key guard.Key) error {
			_, h, err := g.Hold(bg, key, "fp")
			if err != nil {
				return err
			}
			if err := lose(h.Context(), key); !errors.Is(err, guard.ErrLeaseLost) {
				return err
			}
			return h.Complete([]byte("too late"))
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			var lost atomic.Int64
			g := guard.New(s, guard.Options{Lease: 300 * time.Millisecond, Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
				if e.Kind == guard.EventLeaseLost {
					// A slow Observer: the heartbeat's event is still on
					// its way when the run's write is refused, and must be
					// counted before the call returns all the same.
					time.Sleep(50 * time.Millisecond)
					lost.Add(1)
				}
			})})
			key := guard.Key{Scope: "lease-lost-once", ID: name}
			if err := call(g, key); !errors.Is(err, guard.ErrLeaseLost) {
				t.Fatalf("%v, want ErrLeaseLost", err)
			}
			if n := lost.Load(); n != 1 {
				t.Errorf("one lease lost once, observed %d times", n)
			}
		})
	}
}
