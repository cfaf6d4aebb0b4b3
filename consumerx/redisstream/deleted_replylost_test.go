package redisstream

import (
	"bytes"
	"context"
	"fmt"
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

// TestDeletedEntryNotYetIdleDeadLettered: Redis 7's XAUTOCLAIM names
// (and drops from the pending list) a deleted entry however recently it
// was delivered. Such an entry (read by a consumer that died, trimmed at
// once, a reclaim pass before MinIdle) is dead-lettered once whether the
// XAUTOCLAIM reply arrives or is lost. (The read before each XAUTOCLAIM
// looked only at entries idle MinIdle: with the reply lost, the entry was
// lost without a trace; found by review.)
func TestDeletedEntryNotYetIdleDeadLettered(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries int
		minIdle time.Duration
		count   int64
		lose    bool
	}{
		// The control: the reply arrives; the entry is watched, then
		// dead-lettered by Run's last check.
		{"deleted entry not yet idle, reply arrives (control)", 1, time.Minute, 0, false},
		{"deleted entry not yet idle, reply lost", 1, time.Minute, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			ctx := context.Background()
			stream := e.prefix + "orders"
			for i := 1; i <= tc.entries; i++ {
				if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", "charge"}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
				t.Fatal(err)
			}
			// A consumer reads the entries and dies; they are trimmed.
			if _, err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: int64(tc.entries)}).Result(); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= tc.entries; i++ {
				if err := e.rdb.XDel(ctx, stream, fmt.Sprintf("1-%d", i)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range []*redis.Script{gonePendingScript, deadLetterScript} {
				if err := s.Load(ctx, e.rdb).Err(); err != nil {
					t.Fatal(err)
				}
			}
			proxy := testenv.NewReplyDropper(t, e.rdb.Options().Addr)
			own := redis.NewClient(&redis.Options{Addr: proxy.Addr()})
			t.Cleanup(func() { _ = own.Close() })
			if tc.lose {
				proxy.Arm(func(b []byte) bool { return bytes.Contains(b, []byte("\r\nxautoclaim\r\n")) })
			}
			dead := &deadLetters{}
			var ran atomic.Int32
			c, err := New(own, e.g, func(context.Context, consumerx.Message) error { ran.Add(1); return nil },
				Options{Stream: stream, Group: "billing", Consumer: "c", Block: 20 * time.Millisecond,
					MinIdle: tc.minIdle, ClaimEvery: 20 * time.Millisecond, Count: tc.count,
					Process: consumerx.Options{Logger: testenv.Logger(t), DeadLetter: dead.hook}})
			if err != nil {
				t.Fatal(err)
			}
			stop := e.run(c)
			if tc.lose {
				testenv.WaitFor(t, 10*time.Second, "the XAUTOCLAIM reply dropped", func() bool { return proxy.Dropped() == 1 })
			}
			// A few more passes (not to synchronise: Run's last check
			// dead-letters the watched entries with no record, lastCheck,
			// as it does when the reply is not lost, the control).
			time.Sleep(300 * time.Millisecond)
			stop()
			n, err := e.rdb.XLen(ctx, stream+DeadLetterSuffix).Result()
			if err != nil {
				t.Fatal(err)
			}
			if dead.len() != tc.entries || int(n) != tc.entries || ran.Load() != 0 || pending(t, e.rdb, stream, "billing") != 0 {
				t.Errorf("%d entries trimmed while pending (not yet MinIdle), XAUTOCLAIM reply lost %v: dead-lettered %d (stream %d), ran %d, pending %d; want each dead-lettered once",
					tc.entries, tc.lose, dead.len(), n, ran.Load(), pending(t, e.rdb, stream, "billing"))
			}
		})
	}
}
