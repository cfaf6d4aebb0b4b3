package redisstream

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Redis consumer groups belong to a stream, and one group name is often
// used on many streams; entry ids are unique only inside a stream (two
// streams written in the same millisecond give the same ids). Two streams
// read by groups of the same name each run each of their entries: an
// entry of one is not taken for a duplicate of the other's entry with the
// same id, nor dead-lettered as a changed payload.
func TestSameGroupOnTwoStreamsRunsEach(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	streams := []string{e.prefix + "orders-eu", e.prefix + "orders-us"}
	var mu sync.Mutex
	ran := map[string]int{}
	var dead, early []string
	var consumers []*Consumer
	for _, s := range streams {
		for i, payload := range []string{"tick", "charge " + s} { // one payload the same in both streams
			id := []string{"1-1", "1-2"}[i]
			if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: s, ID: id, Values: []any{"payload", payload}}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.rdb.XGroupCreate(ctx, s, "billing", "0").Err(); err != nil {
			t.Fatal(err)
		}
		consumers = append(consumers, e.consumer(func(_ context.Context, msg consumerx.Message) error {
			// An entry is acknowledged only after its effect: it is still
			// pending while its handler runs.
			entry := msg.Raw.(redis.XMessage).ID
			p, err := e.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: s, Group: "billing", Start: entry, End: entry, Count: 1}).Result()
			mu.Lock()
			defer mu.Unlock()
			if err != nil || len(p) != 1 {
				early = append(early, fmt.Sprintf("%s %s (xpending %v, %v)", s, entry, p, err))
			}
			ran[s+" "+string(msg.Payload)]++
			return nil
		}, Options{Stream: s, Group: "billing", Consumer: "c1", Process: consumerx.Options{
			DeadLetter: func(_ context.Context, msg consumerx.Message, _ error) error {
				mu.Lock()
				defer mu.Unlock()
				dead = append(dead, s+" "+msg.ID)
				return nil
			}}}))
	}
	stop := e.run(consumers...)
	testenv.WaitFor(t, 10*time.Second, "every entry acknowledged", func() bool {
		return allAcked(t, e.rdb, streams[0]) && allAcked(t, e.rdb, streams[1])
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(early) != 0 {
		t.Errorf("acknowledged before their handler ran: %v", early)
	}
	if len(ran) != 4 || len(dead) != 0 {
		t.Errorf("ran %v, dead-lettered %v; want each of the 4 entries run once, none dead-lettered", ran, dead)
	}
	for k, n := range ran {
		if n != 1 {
			t.Errorf("%s ran %d times", k, n)
		}
	}
}

// allAcked reports whether group billing of stream has read every entry
// (up to 1-2) and acknowledged each. Both come from one XINFO GROUPS
// reply: read from two commands, a pending count of 0 taken before the
// consumer's XREADGROUP and a last-delivered id taken after it looked
// like the end while both entries were still to run (on a loaded
// machine the test then stopped the consumers first: "ran map[]").
func allAcked(t *testing.T, rdb *redis.Client, stream string) bool {
	t.Helper()
	groups, err := rdb.XInfoGroups(context.Background(), stream).Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(groups) == 1 && groups[0].LastDeliveredID == "1-2" && groups[0].Pending == 0
}

// Message.ID names the stream; a stream name too long for a guard id, or
// holding a control character (a Redis key may), gives a digest of it
// instead, so each entry still has a usable key of its own.
func TestIDOfAnyStreamIsUsable(t *testing.T) {
	e := newEnv(t, guard.Options{})
	if id := ID("orders", "1-2"); id != "orders/1-2" {
		t.Errorf("ID = %q, want orders/1-2", id)
	}
	seen := map[string]bool{}
	for _, s := range []string{"orders", strings.Repeat("s", 300), strings.Repeat("s", 301), "a\nb", "a\x00b"} {
		c := e.consumer(func(context.Context, consumerx.Message) error { return nil }, Options{Stream: s, Group: "billing", Consumer: "c"})
		for _, entry := range []string{"1-2", "1700000000000-12"} {
			msg := c.message(redis.XMessage{ID: entry, Values: map[string]any{"payload": "x"}})
			k, err := c.Processor().Key(msg)
			if err != nil {
				t.Errorf("stream %.10q entry %s: %v", s, entry, err)
				continue
			}
			if seen[k.ID] {
				t.Errorf("id %q given twice", k.ID)
			}
			seen[k.ID] = true
		}
	}
}
