package redisstream

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Consumer b takes over (XAUTOCLAIM) an entry that consumer a is still
// running, its handler slower than b's MinIdle: b finds it in progress and
// leaves it pending, again at every pass, instead of acknowledging an
// entry whose effect has not happened yet; a finishes it and acknowledges
// it. One effect, nothing pending.
func TestTakeOverOfARunningEntryIsNotAcknowledged(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 5"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var started, effects atomic.Int32
	release := make(chan struct{})
	a := e.consumer(func(ctx context.Context, _ consumerx.Message) error {
		started.Add(1)
		select {
		case <-release:
		case <-ctx.Done(): // the test failed before releasing it
			return ctx.Err()
		}
		effects.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "a"})
	var outs consumertest.Outcomes
	b := e.consumer(func(context.Context, consumerx.Message) error {
		effects.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "b", MinIdle: 20 * time.Millisecond, ClaimEvery: 10 * time.Millisecond,
		Process: consumerx.Options{OnOutcome: outs.Hook}})

	stopA := e.run(a)
	defer stopA()
	testenv.WaitFor(t, 10*time.Second, "a running the entry", func() bool { return started.Load() == 1 })
	stopB := e.run(b)
	defer stopB()
	// After b's second answer, its first would have been acknowledged.
	testenv.WaitFor(t, 10*time.Second, "b to take the entry over twice (or acknowledge it)", func() bool {
		return outs.All()[consumerx.InProgress] >= 2 || pending(t, e.rdb, stream, "billing") == 0
	})
	if n := pending(t, e.rdb, stream, "billing"); n != 1 || effects.Load() != 0 {
		t.Fatalf("while a runs the entry: %d pending, %d effects; want it pending, no effect yet", n, effects.Load())
	}
	close(release)
	testenv.WaitFor(t, 10*time.Second, "the entry acknowledged", func() bool {
		return effects.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stopB()
	stopA()
	if n := effects.Load(); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	if all := outs.All(); all[consumerx.Processed] != 0 {
		t.Errorf("b's outcomes %v; want none processed", all)
	}
}
