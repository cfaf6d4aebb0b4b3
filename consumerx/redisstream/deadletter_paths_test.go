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
)

// An entry's last attempt fails and the user's DeadLetter fails after the
// entry was added to the dead-letter stream (the xadd step recorded); the
// entry is then trimmed while pending, and the consumer that finds it
// deleted dead-letters it. The entry is added once, as
// Options.DeadLetterStream promises "though both happen to it": the step
// is recorded under the entry's own dead-letter record, which both paths
// claim. (consumerx's path recorded it under consumerx's own record,
// which the deleted path cannot find, and the entry was added twice.)
func TestDeadLetterAddedOnceAcrossPaths(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	var hook, ok atomic.Int32
	c := e.consumer(func(context.Context, consumerx.Message) error { return errors.New("card declined") },
		Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: time.Hour,
			Process: consumerx.Options{MaxAttempts: 1, DeadLetter: func(context.Context, consumerx.Message, error) error {
				if hook.Add(1) == 1 {
					return errors.New("pager unreachable")
				}
				ok.Add(1)
				return nil
			}}})
	if err := c.createGroup(ctx); err != nil {
		t.Fatal(err)
	}
	id, err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 9"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	read, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "c",
		Streams: []string{stream, ">"}, Count: 1, Block: -1}).Result()
	if err != nil || len(read) != 1 || len(read[0].Messages) != 1 {
		t.Fatalf("xreadgroup = %v, %v", read, err)
	}
	// The last attempt fails; its dead letter is added to the stream, the
	// user's hook fails: not acknowledged, dead-lettering to be retried.
	c.handle(ctx, read[0].Messages, c.guarded)
	if hook.Load() != 1 || pending(t, e.rdb, stream, "billing") != 1 {
		t.Fatalf("after the last attempt: hook %d, pending %d", hook.Load(), pending(t, e.rdb, stream, "billing"))
	}
	if n, _ := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result(); n != 1 {
		t.Fatalf("dead-letter stream after the first try: %d entries, want 1", n)
	}
	// The entry is trimmed; XAUTOCLAIM names it deleted.
	if err := e.rdb.XDel(ctx, stream, id).Err(); err != nil {
		t.Fatal(err)
	}
	c.deleted(ctx, []string{id})
	if ok.Load() != 1 {
		t.Fatalf("the dead letter was not retried on the deleted path: hook calls %d", hook.Load())
	}
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("dead-letter stream has %d entries for one entry; want 1 (the xadd step, recorded, was not found on retry)", n)
	}
}
