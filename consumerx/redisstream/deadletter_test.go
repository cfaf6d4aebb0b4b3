package redisstream

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The user's DeadLetter (called after the entry was added to the
// dead-letter stream) fails once: dead-lettering is retried on the next
// delivery, but the entry goes to the dead-letter stream once, not once
// per try.
func TestDeadLetterStreamOnceWhenUserHookFails(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 9"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var hook, ok atomic.Int32
	c := e.consumer(func(context.Context, consumerx.Message) error { return errors.New("card declined") },
		Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: 50 * time.Millisecond, ClaimEvery: 20 * time.Millisecond,
			Process: consumerx.Options{MaxAttempts: 1, DeadLetter: func(context.Context, consumerx.Message, error) error {
				if hook.Add(1) == 1 {
					return errors.New("pager unreachable")
				}
				ok.Add(1)
				return nil
			}}})
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the entry dead-lettered and acknowledged", func() bool {
		return ok.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || hook.Load() != 2 {
		t.Errorf("dead-letter stream has %d entries, hook called %d times; want 1 entry, 2 calls", n, hook.Load())
	}
}

// Over a fallback.Store whose primary keeps no steps (a wrapper that
// forwards only guard.Store), the dead-letter entry is added once: the
// xadd step is refused before it runs (guard.KeepsSteps), and
// deadLetterOnce adds the entry itself. The step used to run, its result
// kept nowhere, and deadLetterOnce then added the entry again.
func TestDeadLetterStreamOnceOverFallbackWithoutSteps(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	consumertest.DeleteKeysAtEnd(t, rdb, prefix)
	fb, err := fallback.New(struct{ guard.Store }{guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: prefix})}, fallback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, rdb: rdb, g: guard.New(fb, guard.Options{}), prefix: prefix}
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 9"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var hook atomic.Int32
	c := e.consumer(func(context.Context, consumerx.Message) error { return errors.New("card declined") },
		Options{Stream: stream, Group: "billing", Consumer: "c",
			Process: consumerx.Options{MaxAttempts: 1, DeadLetter: func(context.Context, consumerx.Message, error) error {
				hook.Add(1)
				return nil
			}}})
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the entry dead-lettered and acknowledged", func() bool {
		return hook.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || hook.Load() != 1 {
		t.Errorf("dead-letter stream has %d entries, hook called %d times; want 1 entry, 1 call", n, hook.Load())
	}
}
