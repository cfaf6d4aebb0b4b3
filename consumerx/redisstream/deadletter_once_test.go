package redisstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Options.DeadLetterStream: "An entry is added once" (an operator
// re-drives a dead letter by adding its payload again under a new entry
// id, a new key: two dead letters of one entry are two effects). The
// XADD of an entry's dead letter landed in Redis but its answer was lost
// to a dropped connection; go-redis sent it again on a new connection
// (its MaxRetries), and the entry was in the dead-letter stream twice,
// though it was dead-lettered once (found by review).
func TestDeadLetterAddedOnceWhenItsAnswerIsLost(t *testing.T) {
	for _, hook := range []bool{false, true} {
		t.Run(map[bool]string{false: "no DeadLetter hook", true: "with DeadLetter hook (xadd a recorded step)"}[hook], func(t *testing.T) {
			e := newEnv(t, guard.Options{MaxAttempts: 1})
			ctx := context.Background()
			stream := e.prefix + "orders"
			dlq := stream + DeadLetterSuffix
			if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 9"}}).Err(); err != nil {
				t.Fatal(err)
			}
			// The script is loaded: the armed command is the dead letter's,
			// not a NOSCRIPT answer.
			if err := deadLetterScript.Load(ctx, e.rdb).Err(); err != nil {
				t.Fatal(err)
			}
			proxy := testenv.NewReplyDropper(t, e.rdb.Options().Addr)
			own := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
			t.Cleanup(func() { _ = own.Close() })
			proxy.Arm(func(b []byte) bool { return bytes.Contains(b, []byte(dlq)) })
			var hooked, outcomes atomic.Int32
			popts := consumerx.Options{Logger: testenv.Logger(t), OnOutcome: func(_ context.Context, _ consumerx.Message, o consumerx.Outcome, _ error) {
				if o == consumerx.DeadLettered {
					outcomes.Add(1)
				}
			}}
			if hook {
				popts.DeadLetter = func(context.Context, consumerx.Message, error) error { hooked.Add(1); return nil }
			}
			c, err := New(own, e.g, func(context.Context, consumerx.Message) error { return errors.New("card declined") },
				Options{Stream: stream, Group: "billing", Consumer: "c", Block: 50 * time.Millisecond,
					MinIdle: 100 * time.Millisecond, ClaimEvery: 50 * time.Millisecond, Process: popts})
			if err != nil {
				t.Fatal(err)
			}
			stop := e.run(c)
			testenv.WaitFor(t, 15*time.Second, "the entry dead-lettered and acknowledged", func() bool {
				return outcomes.Load() >= 1 && pending(t, e.rdb, stream, "billing") == 0
			})
			stop()
			if proxy.Dropped() != 1 {
				t.Fatalf("the proxy dropped %d XADD replies, want 1", proxy.Dropped())
			}
			n, err := e.rdb.XLen(ctx, dlq).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n != 1 {
				t.Errorf("dead-letter stream has %d entries for one entry dead-lettered once (DeadLettered outcomes %d, hook calls %d) "+
					"after one lost XADD reply; want 1 (\"An entry is added once\")", n, outcomes.Load(), hooked.Load())
			}
		})
	}
}

// TestWideEntryDeadLettered: an entry of 4,000 fields whose only attempt
// failed is dead-lettered once. (Its dead letter went through the script
// that adds it once, whose unpack takes about 8,000 values: it failed on
// every pass, and the entry stayed pending; found by review.)
func TestWideEntryDeadLettered(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 1})
	ctx := context.Background()
	stream := e.prefix + "orders"
	values := make([]any, 0, 8000)
	for i := range 4000 {
		values = append(values, fmt.Sprintf("line%d", i), "x")
	}
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: values}).Err(); err != nil {
		t.Fatal(err)
	}
	var outcomes atomic.Int32
	c, err := New(e.rdb, e.g, func(context.Context, consumerx.Message) error { return errors.New("card declined") },
		Options{Stream: stream, Group: "billing", Consumer: "c", Block: 50 * time.Millisecond,
			MinIdle: 50 * time.Millisecond, ClaimEvery: 50 * time.Millisecond,
			Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: func(_ context.Context, _ consumerx.Message, o consumerx.Outcome, _ error) {
				if o == consumerx.DeadLettered {
					outcomes.Add(1)
				}
			}}})
	if err != nil {
		t.Fatal(err)
	}
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the entry dead-lettered", func() bool { return outcomes.Load() > 0 })
	stop()
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || pending(t, e.rdb, stream, "billing") != 0 {
		t.Errorf("a 4000-field entry whose only attempt failed: dead-letter stream %d entries, %d pending, %d DeadLettered outcomes; want 1, 0 pending",
			n, pending(t, e.rdb, stream, "billing"), outcomes.Load())
	}
}
