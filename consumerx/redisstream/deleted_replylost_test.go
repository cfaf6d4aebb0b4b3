package redisstream

import (
	"bytes"
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Redis 7's XAUTOCLAIM drops a pending entry deleted from the stream from
// the pending list and names it once, in that reply. An entry read by a
// consumer that died before running it, then trimmed, is dead-lettered
// once although the XAUTOCLAIM reply that named it was lost to a dropped
// connection. (go-redis sent XAUTOCLAIM again, whose reply no longer
// named it: the entry was neither run nor dead-lettered, nor logged;
// found by review.)
func TestDeletedEntryDeadLetteredWhenXAutoClaimAnswerIsLost(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-1", Values: []any{"payload", "charge 1"}}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// A consumer reads the entry and dies before running it; the entry is
	// then trimmed.
	if _, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: 1}).Result(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XDel(ctx, stream, "1-1").Err(); err != nil {
		t.Fatal(err)
	}
	// Idle past MinIdle: the first XAUTOCLAIM, whose reply is lost, names it.
	testenv.WaitFor(t, 5*time.Second, "the entry idle 10ms", func() bool {
		p, err := e.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "billing", Idle: 10 * time.Millisecond,
			Start: "-", End: "+", Count: 1}).Result()
		return err == nil && len(p) == 1
	})
	proxy := testenv.NewReplyDropper(t, e.rdb.Options().Addr)
	own := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
	t.Cleanup(func() { _ = own.Close() })
	proxy.Arm(func(b []byte) bool { return bytes.Contains(b, []byte("\r\nxautoclaim\r\n")) })
	dead := &deadLetters{}
	var ran atomic.Int32
	c, err := New(own, e.g, func(context.Context, consumerx.Message) error { ran.Add(1); return nil },
		Options{Stream: stream, Group: "billing", Consumer: "c", Block: 50 * time.Millisecond,
			MinIdle: 10 * time.Millisecond, ClaimEvery: 20 * time.Millisecond,
			Process: consumerx.Options{Logger: testenv.Logger(t), DeadLetter: dead.hook}})
	if err != nil {
		t.Fatal(err)
	}
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the entry dead-lettered", func() bool { return dead.len() >= 1 })
	stop()
	if proxy.Dropped() != 1 {
		t.Fatalf("the proxy dropped %d XAUTOCLAIM replies, want 1", proxy.Dropped())
	}
	n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
	if err != nil {
		t.Fatal(err)
	}
	if dead.len() != 1 || n != 1 || ran.Load() != 0 || pending(t, e.rdb, stream, "billing") != 0 {
		t.Errorf("entry 1-1, trimmed while pending: dead-lettered %d times (dead-letter stream: %d entries), ran %d times, %d pending; want once, never run, none pending",
			dead.len(), n, ran.Load(), pending(t, e.rdb, stream, "billing"))
	}
}
