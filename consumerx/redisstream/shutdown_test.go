package redisstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// An entry whose consumers are stopped mid-handler more times than
// MaxAttempts is still processed exactly once, by the consumer that takes
// it over, and nothing is dead-lettered.
func TestShutdownIsNotFailure(t *testing.T) {
	const maxAttempts, stops = 2, 3
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	h := consumertest.NewInterrupted(stops)
	var outs consumertest.Outcomes
	var dead int
	consumer := func(i int) *Consumer {
		return e.consumer(h.Handle, Options{Stream: stream, Group: "billing", Consumer: fmt.Sprint("c", i),
			MinIdle: 50 * time.Millisecond, ClaimEvery: 20 * time.Millisecond,
			Process: consumerx.Options{MaxAttempts: maxAttempts, OnOutcome: outs.Hook,
				DeadLetter: func(context.Context, consumerx.Message, error) error { dead++; return nil }}})
	}
	for i := range stops {
		stop := e.run(consumer(i))
		h.WaitStarted(t, 10*time.Second) // the entry is read, or taken over from the last consumer
		stop()                           // the consumer shuts down mid-handler
	}
	stop := e.run(consumer(stops))
	testenv.WaitFor(t, 10*time.Second, "the entry processed and acknowledged", func() bool {
		return h.Effects.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	all := outs.All()
	if h.Effects.Load() != 1 || dead != 0 || n != 0 || all[consumerx.Interrupted] != stops || all[consumerx.Processed] != 1 ||
		all[consumerx.DeadLettered] != 0 || all[consumerx.Failed] != 0 {
		t.Fatalf("effects %d, dead letters %d (stream %d), outcomes %v; want 1 effect, %d interrupted, nothing dead",
			h.Effects.Load(), dead, n, all, stops)
	}
}
