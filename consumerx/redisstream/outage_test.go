package redisstream

import (
	"context"
	"fmt"
	"strconv"
	"sync"
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

// The Redis holding the records crashes in the middle of a batch (SIGKILL)
// and comes back with its data (AOF, fsync always) within
// consumerx.CompleteRetry, once the guard found it gone: the handlers
// claimed before the crash, which ran while it was down, have their
// success recorded once it is back, every entry is acknowledged, and no
// effect runs twice. A round whose Redis took longer than half of
// CompleteRetry to come back (a loaded machine starts a process slowly)
// proves nothing, the entries being then rightly left Failed and run
// again, and runs again with a stream and a server of its own.
func TestStoreCrashMidBatch(t *testing.T) {
	const rounds = 3
	for round := 1; ; round++ {
		back := storeCrashRound(t, round)
		if back <= crashBackWithin {
			return
		}
		if round == rounds {
			t.Fatalf("in each of %d rounds Redis came back more than %s after the guard found it gone (last: %s)",
				rounds, crashBackWithin, back.Round(time.Millisecond))
		}
		t.Logf("round %d: Redis came back %s after the guard found it gone, past %s: proves nothing; again",
			round, back.Round(time.Millisecond), crashBackWithin)
	}
}

// crashBackWithin is how soon after the guard found it gone Redis must be
// back for a round of TestStoreCrashMidBatch to prove anything: the
// completions' tries again then still have half of their time.
const crashBackWithin = consumerx.CompleteRetry / 2

// storeCrashRound is a round of TestStoreCrashMidBatch: it returns how
// long Redis took to come back after the guard found it gone, and checks
// the entries only when that was within crashBackWithin.
func storeCrashRound(t *testing.T, round int) (back time.Duration) {
	e := newEnv(t, guard.Options{}) // the stream, on the shared Redis
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	// The server comes back once the guard heard it gone (its writes refused).
	heard := make(chan struct{})
	var once sync.Once
	obs := guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable {
			once.Do(func() { close(heard) })
		}
	})
	// No retries of the client's own: the guard hears the crash.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: 2 * time.Second, Observer: obs})
	ctx := context.Background()
	stream := fmt.Sprintf("%sorders-%d", e.prefix, round)
	const n, crash = 8, 2 // entries; the one whose handler crashes the store
	for i := range n {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"n", i, "payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var (
		effects [n]atomic.Int32
		outs    consumertest.Outcomes
	)
	crashed := make(chan struct{})
	h := func(ctx context.Context, msg consumerx.Message) error {
		i, _ := strconv.Atoi(msg.Metadata["n"])
		effects[i].Add(1)
		if i == crash && effects[i].Load() == 1 {
			srv.Kill()
			close(crashed)
		}
		return nil
	}
	c, err := New(e.rdb, g, h, Options{Stream: stream, Group: "billing", Consumer: "c", Count: n,
		Block: 50 * time.Millisecond, MinIdle: 5 * time.Second, ClaimEvery: 50 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	stop := e.run(c)
	defer stop()
	<-crashed
	<-heard
	heardAt := time.Now()
	srv.Restart()
	if back = time.Since(heardAt); back > crashBackWithin {
		return back
	}
	testenv.WaitFor(t, 20*time.Second, "every entry processed and acknowledged", func() bool {
		return outs.Final()[consumerx.Processed] == n && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	for i := range effects {
		if got := effects[i].Load(); got != 1 {
			t.Errorf("entry %d: %d effects, want 1", i, got)
		}
	}
	if all := outs.All(); all[consumerx.Processed] != n || len(all) != 1 {
		t.Errorf("deliveries %v; want %d processed, nothing else", all, n)
	}
	return back
}

// The Redis holding the records crashes in the middle of a batch and
// stays down past consumerx.CompleteRetry: no entry of the batch is
// acknowledged (each effect that ran may not be recorded), each is Failed,
// and once the store is back every entry is processed and acknowledged:
// none is lost. (An effect that ran before the crash may run again then,
// as the package doc says: write LeaseFrom(ctx).Fence with it.)
func TestStoreDownPastCompleteRetryAcksNothing(t *testing.T) {
	e := newEnv(t, guard.Options{}) // the stream, on the shared Redis
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	const lease = 300 * time.Millisecond
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: lease})
	ctx := context.Background()
	stream := e.prefix + "orders"
	const n, crash = 4, 1
	for i := range n {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"n", i, "payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var (
		effects [n]atomic.Int32
		outs    consumertest.Outcomes
	)
	h := func(ctx context.Context, msg consumerx.Message) error {
		i, _ := strconv.Atoi(msg.Metadata["n"])
		if effects[i].Add(1) == 1 && i == crash {
			srv.Kill()
		}
		return nil
	}
	c, err := New(e.rdb, g, h, Options{Stream: stream, Group: "billing", Consumer: "c", Count: n,
		Block: 50 * time.Millisecond, MinIdle: 2 * lease, ClaimEvery: 50 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	stop := e.run(c)
	defer stop()
	testenv.WaitFor(t, 20*time.Second, "the batch's outcomes", func() bool { return len(outs.Entries()) == n })
	// Each delivery so far Failed: the batch's, and any of a reclaim pass
	// since (its claims refused by the store still down).
	if all := outs.All(); all[consumerx.Failed] < n || len(all) != 1 {
		t.Fatalf("outcomes with the store down: %v; want %d failed, nothing else", all, n)
	}
	if p := pending(t, e.rdb, stream, "billing"); p != n {
		t.Fatalf("%d entries pending with the store down; want all %d (none acknowledged)", p, n)
	}
	srv.Restart()
	testenv.WaitFor(t, 20*time.Second, "every entry processed and acknowledged", func() bool {
		return outs.Final()[consumerx.Processed] == n && pending(t, e.rdb, stream, "billing") == 0
	})
}
