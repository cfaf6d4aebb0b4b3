package redisstream

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The consumer group is deleted while a consumer runs (XGROUP DESTROY, or
// the stream deleted and added to again), and the first command of the
// consumer's next round is XAUTOCLAIM (a pass over the pending list was
// due): the consumer creates the group again, as it does when XREADGROUP
// finds it gone, and goes on consuming, instead of retrying the
// XAUTOCLAIM for ever and never reading again. An entry it had run
// before the deletion comes back to the new group and is a duplicate.
func TestGroupDeletedBeforeAClaimPassIsCreatedAgain(t *testing.T) {
	for name, remove := range map[string]func(rdb *redis.Client, stream string) error{
		"xgroup destroy": func(rdb *redis.Client, stream string) error {
			return rdb.XGroupDestroy(context.Background(), stream, "billing").Err()
		},
		"stream deleted": func(rdb *redis.Client, stream string) error {
			return rdb.Del(context.Background(), stream).Err()
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			ctx := context.Background()
			stream := e.prefix + "orders"
			if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 1"}}).Err(); err != nil {
				t.Fatal(err)
			}
			var (
				mu          sync.Mutex
				ran         = map[string]int{}
				first, gone atomic.Bool
			)
			c := e.consumer(func(_ context.Context, msg consumerx.Message) error {
				if !first.Swap(true) {
					if err := remove(e.rdb, stream); err != nil {
						t.Error(err)
					}
					gone.Store(true)
				}
				mu.Lock()
				defer mu.Unlock()
				ran[string(msg.Payload)]++
				return nil
			}, Options{Stream: stream, Group: "billing", Consumer: "c",
				// A claim pass is due at every round: the round after the
				// deletion starts with XAUTOCLAIM.
				MinIdle: time.Minute, ClaimEvery: time.Nanosecond})
			stop := e.run(c)
			testenv.WaitFor(t, 10*time.Second, "the group removed", gone.Load)
			if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 2"}}).Err(); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 10*time.Second, "the entry added after the deletion run and everything acknowledged", func() bool {
				mu.Lock()
				done := ran["charge 2"] == 1
				mu.Unlock()
				return done && pending(t, e.rdb, stream, "billing") == 0
			})
			stop()
			mu.Lock()
			defer mu.Unlock()
			if ran["charge 1"] != 1 || ran["charge 2"] != 1 || len(ran) != 2 {
				t.Errorf("ran %v; want each entry once", ran)
			}
		})
	}
}
