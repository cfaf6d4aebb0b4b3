package redisstream

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestTrimmedEntriesPastOnePassAllDeadLettered: a dead consumer's pending
// entries are trimmed from the stream (a MAXLEN trim under a backlog), none
// of them run. Redis 7's XAUTOCLAIM drops them from the pending list and
// names them once; the consumer watches them for MinIdle, then
// dead-letters them. The DeadLetter hook takes 60ms (a publish to another
// broker): more entries than one pass's time (deletedTimeout) answers.
// Every one must still be dead-lettered, once: those past the pass's time
// were given up (logged "not dead-lettered"), lost for good, as Redis
// never names them again. They are answered on the next pass now.
func TestTrimmedEntriesPastOnePassAllDeadLettered(t *testing.T) {
	defer func(d time.Duration) { deletedTimeout = d }(deletedTimeout)
	deletedTimeout = 500 * time.Millisecond // 8 dead letters a pass
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	const n = 40
	for i := 1; i <= n; i++ {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: fmt.Sprintf("1-%d", i), Values: []any{"payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.rdb.XGroupCreate(ctx, stream, "billing", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "billing", Consumer: "dead", Streams: []string{stream, ">"}, Count: n}).Err(); err != nil {
		t.Fatal(err)
	}
	// Trimmed: a producer's MAXLEN 0 (XTRIM here).
	if err := e.rdb.XTrimMaxLen(ctx, stream, 0).Err(); err != nil {
		t.Fatal(err)
	}

	var (
		mu   sync.Mutex
		dead = map[string]int{}
	)
	var logs testenv.Buffer
	c := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: stream, Group: "billing", Consumer: "c", Count: 2 * n, MinIdle: 50 * time.Millisecond, ClaimEvery: 10 * time.Millisecond,
			Process: consumerx.Options{
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
				DeadLetter: func(ctx context.Context, msg consumerx.Message, _ error) error {
					select {
					case <-time.After(60 * time.Millisecond):
					case <-ctx.Done():
						return ctx.Err()
					}
					mu.Lock()
					defer mu.Unlock()
					dead[msg.ID]++
					return nil
				}}})
	stop := e.run(c)
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(dead)
	}
	testenv.WaitFor(t, 30*time.Second, "every trimmed entry dead-lettered, or one given up", func() bool {
		return count() == n || strings.Contains(logs.String(), "not dead-lettered")
	})
	stop()
	if got := count(); got != n {
		var lost []string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "not dead-lettered") {
				lost = append(lost, l)
			}
		}
		first := ""
		if len(lost) > 0 {
			first = lost[0]
		}
		t.Fatalf("%d of %d trimmed entries dead-lettered; %d given up (\"not dead-lettered\" logs), the first: %s", got, n, len(lost), first)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, k := range dead {
		if k != 1 {
			t.Errorf("%s dead-lettered %d times", id, k)
		}
	}
}
