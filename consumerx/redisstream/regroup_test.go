package redisstream

import (
	"context"
	"errors"
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

// counter counts a handler's runs per payload.
type counter struct {
	mu  sync.Mutex
	ran map[string]int
}

func (n *counter) handle(_ context.Context, msg consumerx.Message) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ran == nil {
		n.ran = map[string]int{}
	}
	n.ran[string(msg.Payload)]++
	return nil
}

func (n *counter) runs(payload string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ran[payload]
}

func (n *counter) snapshot() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := make(map[string]int, len(n.ran))
	for k, v := range n.ran {
		m[k] = v
	}
	return m
}

func xadd(t *testing.T, rdb *redis.Client, stream, payload string) string {
	t.Helper()
	id, err := rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: stream, Values: []any{"payload", payload}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// groupInfo returns the group's last delivered id and pending count, ok
// false while the group does not exist.
func groupInfo(t *testing.T, rdb *redis.Client, stream, group string) (last string, pending int64, ok bool) {
	t.Helper()
	groups, err := rdb.XInfoGroups(context.Background(), stream).Result()
	if err != nil && !errors.Is(err, redis.Nil) && err.Error() != "ERR no such key" {
		t.Fatalf("xinfo groups: %v", err)
	}
	for _, g := range groups {
		if g.Name == group {
			return g.LastDeliveredID, g.Pending, true
		}
	}
	return "", 0, false
}

// waitExpired waits until the guard records of the entries ids of stream
// have expired (the guard's TTL is short).
func waitExpired(t *testing.T, e *env, c *Consumer, stream string, ids ...string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the records of the entries handled to expire", func() bool {
		for _, id := range ids {
			key, err := c.Processor().Key(consumerx.Message{ID: ID(stream, id)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.g.Get(context.Background(), key); !errors.Is(err, guard.ErrNotFound) {
				return false
			}
		}
		return true
	})
}

// waitDelivered waits until the group exists again, has delivered the
// entry id and has nothing pending: an entry before id that the group
// would deliver again has been delivered (and run) by then.
func waitDelivered(t *testing.T, n *counter, rdb *redis.Client, stream, payload, id string) {
	t.Helper()
	testenv.WaitFor(t, 10*time.Second, "the entry added after the deletion run and acknowledged", func() bool {
		last, pending, ok := groupInfo(t, rdb, stream, "billing")
		return ok && n.runs(payload) == 1 && last == id && pending == 0
	})
}

// The consumer group is destroyed under a running consumer after it has
// run entries whose guard records have since expired (the guard's TTL):
// the group it creates again starts after the last entry it had read,
// not from Options.Start ("0"), so those entries are not delivered and
// run again (a second payment) and the entry added after the deletion
// runs once.
func TestGroupCreatedAgainDoesNotRunExpiredEntriesAgain(t *testing.T) {
	e := newEnv(t, guard.Options{TTL: 200 * time.Millisecond})
	stream := e.prefix + "orders"
	old := []string{xadd(t, e.rdb, stream, "old 1"), xadd(t, e.rdb, stream, "old 2"), xadd(t, e.rdb, stream, "old 3")}
	var n counter
	c := e.consumer(n.handle, Options{Stream: stream, Group: "billing", Consumer: "c"})
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the first entries run and acknowledged", func() bool {
		_, pending, _ := groupInfo(t, e.rdb, stream, "billing")
		return n.runs("old 3") == 1 && pending == 0
	})
	waitExpired(t, e, c, stream, old...)
	if err := e.rdb.XGroupDestroy(context.Background(), stream, "billing").Err(); err != nil {
		t.Fatal(err)
	}
	id := xadd(t, e.rdb, stream, "new 1")
	waitDelivered(t, &n, e.rdb, stream, "new 1", id)
	stop()
	if got := n.snapshot(); len(got) != 4 || got["old 1"] != 1 || got["old 2"] != 1 || got["old 3"] != 1 || got["new 1"] != 1 {
		t.Errorf("ran %v; want each entry once", got)
	}
}

// As above, but the consumer has read nothing yet: it started on a group
// another consumer had read the first entries with. The group it creates
// again starts after the last entry the group had delivered when the
// consumer started. (Run's steps are called one by one: Redis names no
// consumer in XINFO before it has read an entry, so nothing shows the
// consumer has started.)
func TestGroupCreatedAgainByAConsumerThatReadNothing(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	xadd(t, e.rdb, stream, "old 1")
	old := xadd(t, e.rdb, stream, "old 2")
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "$").Err(); err != nil {
		t.Fatal(err)
	}
	c := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "c"})
	if err := c.createGroup(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XGroupDestroy(ctx, stream, "billing").Err(); err != nil {
		t.Fatal(err)
	}
	nogroup := errors.New("NOGROUP No such key or consumer group")
	if err := c.noGroup(ctx, nogroup); err != nogroup {
		t.Fatalf("noGroup: %v", err)
	}
	if last, _, _ := groupInfo(t, e.rdb, stream, "billing"); last != old {
		t.Errorf("the group created again starts after %s; want %s, where it was when the consumer started", last, old)
	}
}

// Consumers of one group that have read different amounts find it gone
// and create it again in turn: whichever is first, it ends after the
// highest id any of them had read, and is never moved back.
func TestGroupCreatedAgainStartsAfterTheHighestIDRead(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	var ids []string
	for _, p := range []string{"1", "2", "3"} {
		ids = append(ids, xadd(t, e.rdb, stream, p))
	}
	consumers := make([]*Consumer, len(ids))
	for i := range consumers {
		consumers[i] = e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: fmt.Sprint(i)})
		consumers[i].read = ids[i] // consumer i has read up to entry i
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", ids[2]).Err(); err != nil {
		t.Fatal(err)
	}
	nogroup := errors.New("NOGROUP No such key or consumer group")
	for _, order := range [][]int{{0, 2, 1}, {1, 0, 2}, {2, 1, 0}} {
		if err := e.rdb.XGroupDestroy(ctx, stream, "billing").Err(); err != nil {
			t.Fatal(err)
		}
		for _, i := range order {
			if err := consumers[i].noGroup(ctx, nogroup); err != nogroup {
				t.Fatalf("noGroup: %v", err)
			}
		}
		if last, _, _ := groupInfo(t, e.rdb, stream, "billing"); last != ids[2] {
			t.Errorf("order %v: the group starts after %s; want %s, the highest id read", order, last, ids[2])
		}
	}
}

// The stream is deleted and made again (by the consumer, or by a
// producer's XADD with a low explicit id before the consumer saw the group
// gone): the group starts after the last entry read, and so does the
// stream's id, so an entry added with "*" is delivered (its id above,
// whatever the clock) and one added with an explicit id at or below it is
// refused, not silently never delivered.
func TestStreamMadeAgainContinuesAfterTheLastIDRead(t *testing.T) {
	for name, remake := range map[string]func(ctx context.Context, rdb *redis.Client, stream string) error{
		"by the consumer": func(context.Context, *redis.Client, string) error { return nil },
		"by a producer": func(ctx context.Context, rdb *redis.Client, stream string) error {
			return rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-1", Values: []any{"payload", "low"}}).Err()
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			ctx := context.Background()
			stream := e.prefix + "orders"
			const read = "9999999999999-5"
			if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: read, Values: []any{"payload", "old"}}).Err(); err != nil {
				t.Fatal(err)
			}
			c := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "c"})
			if err := c.createGroup(ctx); err != nil {
				t.Fatal(err)
			}
			c.read = read
			if err := e.rdb.Del(ctx, stream).Err(); err != nil {
				t.Fatal(err)
			}
			if err := remake(ctx, e.rdb, stream); err != nil {
				t.Fatal(err)
			}
			nogroup := errors.New("NOGROUP No such key or consumer group")
			if err := c.noGroup(ctx, nogroup); err != nogroup {
				t.Fatalf("noGroup: %v", err)
			}
			if last, _, _ := groupInfo(t, e.rdb, stream, "billing"); last != read {
				t.Errorf("the group starts after %s; want %s", last, read)
			}
			if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "2-1", Values: []any{"payload", "low"}}).Err(); err == nil {
				t.Error("XADD 2-1 accepted: the entry would never be delivered to the group")
			}
			if id := xadd(t, e.rdb, stream, "new"); maxID(id, read) != id || id == read {
				t.Errorf("XADD * gave %s, not above the last id read", id)
			}
		})
	}
}

// The group script's replies (XINFO inside it, its own) read alike over
// RESP3 and RESP2, on a standalone Redis and on a Cluster: Run finds the
// group's id, and a group created again starts after the last id read.
// No bug: pins it.
func TestGroupCreatedAgainUnderRESP2AndRESP3(t *testing.T) {
	e := newEnv(t, guard.Options{})
	for _, tc := range protocols(t) {
		t.Run(tc.name, func(t *testing.T) {
			rdb := tc.client()
			t.Cleanup(func() { _ = rdb.Close() })
			ctx := context.Background()
			stream := "{" + e.prefix + "}" + testenv.Prefix(t) + "orders"
			t.Cleanup(func() { rdb.Del(context.Background(), stream) })
			for i := 1; i <= 3; i++ {
				if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", "x"}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if err := rdb.XGroupCreate(ctx, stream, "billing", "1-2").Err(); err != nil {
				t.Fatal(err)
			}
			c, err := New(rdb, e.g, new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "c"})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.createGroup(ctx); err != nil || c.read != "1-2" {
				t.Fatalf("createGroup: %v, read %q; want read 1-2", err, c.read)
			}
			c.read = "1-3"
			if err := rdb.XGroupDestroy(ctx, stream, "billing").Err(); err != nil {
				t.Fatal(err)
			}
			nogroup := errors.New("NOGROUP No such key or consumer group")
			if err := c.noGroup(ctx, nogroup); err != nogroup {
				t.Fatalf("noGroup: %v", err)
			}
			groups, err := rdb.XInfoGroups(ctx, stream).Result()
			if err != nil || len(groups) != 1 || groups[0].LastDeliveredID != "1-3" {
				t.Fatalf("groups %v, %v; want billing at 1-3", groups, err)
			}
		})
	}
}

// The stream is deleted and two consumers that had read different amounts
// find the group gone: the one that had read less makes the stream again
// first, with the group and the stream's id at its own id; the other then
// moves the group forward to its higher id, and the stream's id with it,
// so that an entry added with an explicit id between the two is refused,
// not accepted and never delivered (the group already past it).
func TestStreamMadeAgainByConsumersThatReadDifferentAmounts(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	for i := 1; i <= 3; i++ {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", "old"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	less := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "less"})
	more := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "more"})
	for _, c := range []*Consumer{less, more} {
		if err := c.createGroup(ctx); err != nil {
			t.Fatal(err)
		}
	}
	less.read, more.read = "1-1", "1-3"
	if err := e.rdb.Del(ctx, stream).Err(); err != nil {
		t.Fatal(err)
	}
	nogroup := errors.New("NOGROUP No such key or consumer group")
	for _, c := range []*Consumer{less, more} {
		if err := c.noGroup(ctx, nogroup); err != nogroup {
			t.Fatalf("noGroup: %v", err)
		}
	}
	if last, _, _ := groupInfo(t, e.rdb, stream, "billing"); last != "1-3" {
		t.Errorf("the group starts after %s; want 1-3", last)
	}
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-2", Values: []any{"payload", "new"}}).Err(); err == nil {
		t.Error("XADD 1-2 accepted: the entry would never be delivered to the group")
	}
}

// As above, but a producer adds an entry to the stream the consumer that
// had read less made again, before the other moves the group past it: the
// entry is not delivered, and the group script says so (its id is
// returned as the stream's last id behind, which noGroup logs at Error
// level).
func TestStreamMadeAgainAddedToBeforeTheGroupMovesForward(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	less := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "less"})
	more := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "more"})
	less.read, more.read = "1-1", "1-3"
	if _, _, err := less.group(ctx, less.read, "again"); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: "1-2", Values: []any{"payload", "new"}}).Err(); err != nil {
		t.Fatal(err)
	}
	last, behind, err := more.group(ctx, more.read, "again")
	if err != nil || last != "1-3" || behind != "1-2" {
		t.Errorf("group = %q, %q, %v; want 1-3, stream behind at 1-2", last, behind, err)
	}
}

// The stream is deleted while consumers are blocked in XREADGROUP: Redis
// answers them "UNBLOCKED the stream key no longer exists", not NOGROUP.
// Each creates the group again then, as on NOGROUP: were they to wait for
// their next command's NOGROUP, the first to send one would make the
// group at its own id, and the others, finding it there, would not move
// it forward to theirs (entries they had read would be delivered again).
func TestStreamDeletedUnderBlockedConsumersCreatedAgainAtTheHighestID(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	for i := 1; i <= 3; i++ {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", "old"}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "$").Err(); err != nil {
		t.Fatal(err)
	}
	// The error a blocked XREADGROUP gets as the stream is deleted.
	name := strings.ReplaceAll(e.prefix, ":", "-") + "blocked"
	blocked := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ClientName: name})
	t.Cleanup(func() { _ = blocked.Close() })
	errc := make(chan error, 1)
	go func() {
		errc <- blocked.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "more", Streams: []string{stream, ">"}, Block: 10 * time.Second}).Err()
	}()
	testenv.WaitFor(t, 10*time.Second, "the XREADGROUP to block", func() bool {
		list, err := e.rdb.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " name="+name+" ") && strings.Contains(line, "cmd=xreadgroup") {
				return true
			}
		}
		return false
	})
	if err := e.rdb.Del(ctx, stream).Err(); err != nil {
		t.Fatal(err)
	}
	unblocked := <-errc
	if unblocked == nil {
		t.Fatal("the blocked XREADGROUP returned no error as the stream was deleted")
	}
	less := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "less"})
	more := e.consumer(new(counter).handle, Options{Stream: stream, Group: "billing", Consumer: "more"})
	less.read, more.read = "1-1", "1-3"
	// less's next command finds the group gone first.
	nogroup := errors.New("NOGROUP No such key or consumer group")
	if err := less.noGroup(ctx, nogroup); err != nogroup {
		t.Fatalf("noGroup: %v", err)
	}
	if err := more.noGroup(ctx, unblocked); err != unblocked {
		t.Fatalf("noGroup: %v", err)
	}
	if last, _, _ := groupInfo(t, e.rdb, stream, "billing"); last != "1-3" {
		t.Errorf("the group starts after %s; want 1-3, the highest id read (more was told %q)", last, unblocked)
	}
}
