package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Entries left pending by a dead consumer are trimmed from the stream
// (XTRIM, MAXLEN) before anyone takes them over. Redis 7's XAUTOCLAIM
// drops such entries from the pending list itself and names them apart
// from the entries it hands over. The one whose effect never ran is
// dead-lettered (ErrDeleted), not lost without a trace; the one whose
// effect had completed (only its XACK was lost) is not, for a dead letter
// would invite running it again; the entry still in the stream runs.
func TestPendingEntryTrimmedIsDeadLettered(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	for i := 1; i <= 3; i++ {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// A consumer reads the three entries and dies.
	read, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: 3}).Result()
	if err != nil || len(read) != 1 || len(read[0].Messages) != 3 {
		t.Fatalf("xreadgroup = %v, %v", read, err)
	}

	var (
		mu    sync.Mutex
		ran   = map[string]int{}
		dead  []string
		cause error
	)
	c := e.consumer(func(_ context.Context, msg consumerx.Message) error {
		mu.Lock()
		defer mu.Unlock()
		ran[string(msg.Payload)]++
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: time.Millisecond, ClaimEvery: 10 * time.Millisecond,
		Process: consumerx.Options{DeadLetter: func(_ context.Context, msg consumerx.Message, err error) error {
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, msg.ID)
			cause = err
			return nil
		}}})
	// The dead consumer had run entry 1-2 to completion; only its XACK
	// was lost.
	if o, err := c.Processor().Process(ctx, c.message(read[0].Messages[1]), c.handler); o != consumerx.Processed {
		t.Fatalf("entry 1-2: %s, %v", o, err)
	}
	if err := e.rdb.XTrimMinID(ctx, stream, "1-3").Err(); err != nil {
		t.Fatal(err)
	}

	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the trimmed entry dead-lettered, the other run, none pending", func() bool {
		mu.Lock()
		done := len(dead) > 0 && ran["charge 3"] > 0
		mu.Unlock()
		return done && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()

	mu.Lock()
	defer mu.Unlock()
	if len(dead) != 1 || dead[0] != ID(stream, "1-1") || !errors.Is(cause, ErrDeleted) {
		t.Errorf("dead-lettered %v (cause %v); want %s alone, with a cause matching ErrDeleted", dead, cause, ID(stream, "1-1"))
	}
	if ran["charge 1"] != 0 || ran["charge 2"] != 1 || ran["charge 3"] != 1 {
		t.Errorf("ran %v; want charge 2 (before) and charge 3 once, charge 1 never (its payload is gone)", ran)
	}
	entries, err := e.rdb.XRange(ctx, stream+DeadLetterSuffix, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("dead-letter stream has %d entries, want 1", len(entries))
	}
	if v := entries[0].Values; v[FieldDeadID] != "1-1" || v[FieldDeadGroup] != "billing" || v[FieldDeadStream] != stream ||
		!strings.Contains(fmt.Sprint(v[FieldDeadError]), "deleted") {
		t.Errorf("dead-letter entry = %v", v)
	}
}

// Options.Process.DeadLetter panics for a pending entry deleted from the
// stream: the consumer goes on (the entry still in the stream runs), as
// when it panics for an entry that cannot succeed; the dead-letter
// stream, written before the hook, has the deleted entry.
func TestPendingEntryTrimmedDeadLetterPanicKeepsConsumer(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	for i := 1; i <= 2; i++ {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: 2}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XDel(ctx, stream, "1-1").Err(); err != nil {
		t.Fatal(err)
	}
	var ran, hooked atomic.Int32
	c := e.consumer(func(context.Context, consumerx.Message) error {
		ran.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: time.Millisecond, ClaimEvery: 10 * time.Millisecond,
		Process: consumerx.Options{DeadLetter: func(context.Context, consumerx.Message, error) error {
			hooked.Add(1)
			panic("pager down")
		}}})
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the entry in the stream run, none pending", func() bool {
		return ran.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || hooked.Load() != 1 {
		t.Errorf("dead-letter stream has %d entries, hook called %d times; want 1, 1", n, hooked.Load())
	}
}

// The consumer's context ends just as the XAUTOCLAIM that dropped a
// deleted pending entry answers: the entry is dead-lettered all the
// same, for Redis will not name it again and nothing else would.
func TestPendingEntryTrimmedDeadLetteredDuringShutdown(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-1", Values: []any{"payload", "charge 1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: 1}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XDel(ctx, stream, "1-1").Err(); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	e.rdb.AddHook(cancelAfter{name: "xautoclaim", cancel: stop})
	var hooked atomic.Int32
	c := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: time.Millisecond,
			Process: consumerx.Options{DeadLetter: func(context.Context, consumerx.Message, error) error {
				hooked.Add(1)
				return nil
			}}})
	if err := c.Run(runCtx); err != nil {
		t.Fatal(err)
	}
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || hooked.Load() != 1 {
		t.Errorf("dead-letter stream has %d entries, hook called %d times; want 1, 1", n, hooked.Load())
	}
}

// cancelAfter calls cancel once a command named name has answered.
type cancelAfter struct {
	name   string
	cancel context.CancelFunc
}

func (h cancelAfter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h cancelAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == h.name {
			h.cancel()
		}
		return err
	}
}
func (h cancelAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
