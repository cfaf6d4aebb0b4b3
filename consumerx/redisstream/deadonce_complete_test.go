package redisstream

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// failScriptAfterXAdd fails, once, the first script call that follows
// the first XADD to stream: the completion of the entry's dead-letter
// record (sendOnce), written right after the dead letter was added.
type failScriptAfterXAdd struct {
	stream string
	armed  *atomic.Bool
	failed *atomic.Int32
}

func (h failScriptAfterXAdd) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h failScriptAfterXAdd) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && h.armed.Load() && h.failed.Load() == 0 {
			h.failed.Add(1)
			err := errors.New("connection reset by peer")
			cmd.SetErr(err)
			return err
		}
		err := next(ctx, cmd)
		if addsTo(cmd, h.stream) && err == nil {
			h.armed.Store(true)
		}
		return err
	}
}
func (h failScriptAfterXAdd) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Options.DeadLetterStream: "An entry is added once". consumerx retries the
// completion of a sent dead letter's record (CompleteRetry), but the
// entry's own dead-letter record (sendOnce), under which redisstream sends
// the XADD when Process.DeadLetter is nil, gets no retry and records no
// step: one lost reply to its completion and the next delivery adds the
// entry to the dead-letter stream again.
func TestDeadLetterStreamOnceWhenEntryCompletionRefused(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 1, Lease: time.Second})
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 9"}}).Err(); err != nil {
		t.Fatal(err)
	}
	h := failScriptAfterXAdd{stream: stream + DeadLetterSuffix, armed: new(atomic.Bool), failed: new(atomic.Int32)}
	e.rdb.AddHook(h)
	var outcomes atomic.Int32
	c := e.consumer(func(context.Context, consumerx.Message) error { return errors.New("card declined") },
		Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: 100 * time.Millisecond, ClaimEvery: 50 * time.Millisecond,
			Process: consumerx.Options{OnOutcome: func(_ context.Context, _ consumerx.Message, o consumerx.Outcome, _ error) {
				if o == consumerx.DeadLettered {
					outcomes.Add(1)
				}
			}}})
	stop := e.run(c)
	testenv.WaitFor(t, 15*time.Second, "the entry dead-lettered and acknowledged", func() bool {
		return outcomes.Load() >= 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	if h.failed.Load() != 1 {
		t.Fatalf("the completion after the dead letter was not failed (%d)", h.failed.Load())
	}
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("dead-letter stream has %d entries after one lost completion reply; want 1 (\"An entry is added once\")", n)
	}
}
