package redisstream

import (
	"context"
	"fmt"
	"sync/atomic"
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

// An entry without a usable key that was dead-lettered in a batch the
// consumer then stopped in (so the batch was not acknowledged) is not
// dead-lettered again when the next consumer takes it over: one bad entry,
// one dead letter.
func TestBadEntryDeadLetteredOnceAcrossShutdown(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	for _, v := range [][]any{{"mid", "m1", "payload", "charge 1"}, {"payload", "no mid"}} {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: v}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	h := consumertest.NewInterrupted(1)
	var outs consumertest.Outcomes
	var dead atomic.Int32
	consumer := func(i int) *Consumer {
		return e.consumer(h.Handle, Options{Stream: stream, Group: "billing", Consumer: fmt.Sprint("c", i),
			MinIdle: 50 * time.Millisecond, ClaimEvery: 20 * time.Millisecond,
			Process: consumerx.Options{Key: keyField, OnOutcome: outs.Hook,
				DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }}})
	}
	stop := e.run(consumer(0))
	h.WaitStarted(t, 10*time.Second) // the bad entry is dead-lettered, the good one runs
	stop()                           // the consumer shuts down mid-batch: nothing acknowledged
	stop = e.run(consumer(1))
	testenv.WaitFor(t, 10*time.Second, "both entries acknowledged", func() bool {
		return h.Effects.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if all := outs.All(); dead.Load() != 1 || n != 1 || all[consumerx.DeadLettered] != 2 || h.Effects.Load() != 1 {
		t.Fatalf("dead letters %d (stream %d), effects %d, outcomes %v; want 1 dead letter, delivered twice, 1 effect",
			dead.Load(), n, h.Effects.Load(), all)
	}
}
