package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// The Redis holding the stream and the records runs out of memory
// (noeviction) in the middle of a batch: the handlers already claimed
// still have their success recorded and are acknowledged; the next
// batch's claims are refused, so its handlers do not run and nothing is
// acknowledged or dead-lettered; once memory is freed, every entry is
// processed, each effect exactly once, and nothing stays pending.
func TestOutOfMemoryMidBatch(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	rdb, admin := srv.Client(), srv.Client()
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: 500 * time.Millisecond})
	ctx := context.Background()
	const n, full = 16, 2 // entries; the one whose handler fills the memory
	for i := range n {
		if err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: []any{"n", i, "payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var (
		effects [n]atomic.Int32
		filled  atomic.Bool
		refused atomic.Int32 // deliveries whose claim the full server refused
		outs    consumertest.Outcomes
	)
	h := func(ctx context.Context, msg consumerx.Message) error {
		i, _ := strconv.Atoi(msg.Metadata["n"])
		effects[i].Add(1)
		if i == full && !filled.Swap(true) {
			used, err := usedMemory(admin)
			if err == nil {
				err = admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used/2, 10)).Err()
			}
			if err != nil {
				t.Error(err)
			}
		}
		return nil
	}
	hook := func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
		outs.Hook(ctx, msg, o, err)
		if o == consumerx.Failed && errors.Is(err, guard.ErrUnavailable) && strings.Contains(err.Error(), "OOM") {
			refused.Add(1)
		}
	}
	c, err := New(rdb, g, h, Options{Stream: "orders", Group: "billing", Consumer: "c", Count: 8, Concurrency: 2,
		Block: 50 * time.Millisecond, MinIdle: 200 * time.Millisecond, ClaimEvery: 50 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: hook}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	testenv.WaitFor(t, 20*time.Second, "the next batch's claims refused on the full server", func() bool {
		return refused.Load() >= n/2
	})
	if got := outs.Final()[consumerx.Processed]; got != n/2 {
		t.Errorf("while memory was full, %d entries processed; want the %d of the batch claimed before", got, n/2)
	}
	for i := n / 2; i < n; i++ {
		if effects[i].Load() != 0 {
			t.Errorf("entry %d ran on the full server", i)
		}
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "every entry processed and acknowledged", func() bool {
		return outs.Final()[consumerx.Processed] == n && pending(t, rdb, "orders", "billing") == 0
	})
	for i := range effects {
		if got := effects[i].Load(); got != 1 {
			t.Errorf("entry %d: %d effects, want 1", i, got)
		}
	}
	if all := outs.All(); all[consumerx.DeadLettered] != 0 || all[consumerx.Duplicate] != 0 {
		t.Errorf("deliveries %v; want none dead-lettered or duplicate", all)
	}
}

// usedMemory is the server's used_memory (INFO memory).
func usedMemory(c *redis.Client) (int64, error) {
	info, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("no used_memory in INFO memory")
}
