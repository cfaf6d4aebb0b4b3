package redisstream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// env is one test's Redis client, guard and key prefix.
type env struct {
	t      *testing.T
	rdb    *redis.Client
	g      *guard.Guard
	prefix string
}

func newEnv(t *testing.T, gopts guard.Options) *env {
	t.Helper()
	g, rdb, prefix := consumertest.Guard(t, gopts)
	return &env{t: t, rdb: rdb, g: g, prefix: prefix}
}

// run starts consumers and returns a stop function that cancels them and
// waits until every Run returned, failing the test if one returned an error.
func (e *env) run(consumers ...*Consumer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, len(consumers))
	for _, c := range consumers {
		wg.Go(func() { errs <- c.Run(ctx) })
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					e.t.Errorf("Run: %v", err)
				}
			}
		})
	}
	e.t.Cleanup(stop)
	return stop
}

func (e *env) consumer(h consumerx.Handler, opts Options) *Consumer {
	e.t.Helper()
	if opts.Process.Logger == nil {
		opts.Process.Logger = testenv.Logger(e.t)
	}
	if opts.Block == 0 {
		opts.Block = 100 * time.Millisecond
	}
	c, err := New(e.rdb, e.g, h, opts)
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return c
}

func pending(t *testing.T, rdb *redis.Client, stream, group string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		t.Fatalf("xpending: %v", err)
	}
	return p.Count
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func keyField(msg consumerx.Message) (string, error) {
	id := msg.Metadata["mid"]
	if id == "" {
		return "", errors.New("no mid field")
	}
	return id, nil
}

// The seed's checkpoint: 10,000 entries, 3,000 of them the same logical
// message added again, 50 consumers: 7,000 effects, every duplicate seen,
// nothing pending.
func TestTenThousandWithDuplicatesFiftyConsumers(t *testing.T) {
	const distinct, dups, consumers = 7000, 3000, 50
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"

	// Entries: every logical message once, 3,000 of them twice, shuffled.
	ids := make([]int, 0, distinct+dups)
	for i := range distinct {
		ids = append(ids, i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ids = append(ids, rng.Perm(distinct)[:dups]...)
	rng.Shuffle(len(ids), func(a, b int) { ids[a], ids[b] = ids[b], ids[a] })
	pipe := e.rdb.Pipeline()
	for _, i := range ids {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"mid", fmt.Sprintf("order-%d", i), "payload", fmt.Sprintf("charge %d", i)}})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("xadd: %v", err)
	}

	effects := make([]atomic.Int32, distinct)
	var total atomic.Int64
	handler := func(ctx context.Context, msg consumerx.Message) error {
		var i int
		if _, err := fmt.Sscanf(msg.Metadata["mid"], "order-%d", &i); err != nil {
			return err
		}
		effects[i].Add(1)
		total.Add(1)
		return nil
	}
	var outs consumertest.Outcomes
	cs := make([]*Consumer, consumers)
	for i := range cs {
		cs[i] = e.consumer(handler, Options{
			Stream: stream, Group: "billing", Consumer: fmt.Sprintf("c%d", i),
			Concurrency: 1 + i%2, // half the consumers run two entries at once
			MinIdle:     2 * time.Second, ClaimEvery: 500 * time.Millisecond,
			Process: consumerx.Options{Key: keyField, OnOutcome: outs.Hook},
		})
	}
	snapshot := goleak.IgnoreCurrent()
	start := time.Now()
	stop := e.run(cs...)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("outcomes by entry %v, all deliveries %v", outs.Final(), outs.All())
		}
	})
	testenv.WaitFor(t, 80*time.Second, "every entry acknowledged", func() bool {
		f := outs.Final()
		return f[consumerx.Processed]+f[consumerx.Duplicate] == distinct+dups && pending(t, e.rdb, stream, "billing") == 0
	})
	elapsed := time.Since(start)
	stop()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)

	if got := total.Load(); got != distinct {
		t.Errorf("side effects = %d, want %d", got, distinct)
	}
	for i := range effects {
		if n := effects[i].Load(); n != 1 {
			t.Fatalf("order-%d ran %d times", i, n)
		}
	}
	// Each logical message was processed by exactly one entry; every other
	// entry (the 3,000 added again) was acknowledged as a duplicate. An
	// entry reclaimed between its run and its ack also ends as a duplicate.
	ran, dupOnly := 0, 0
	for id, list := range outs.Entries() {
		processed, duplicate := 0, false
		for _, o := range list {
			processed += btoi(o == consumerx.Processed)
			duplicate = duplicate || o == consumerx.Duplicate
		}
		switch {
		case processed == 1:
			ran++
		case processed == 0 && duplicate:
			dupOnly++
		default:
			t.Errorf("entry %s: outcomes %v", id, list)
		}
	}
	if all := outs.All(); ran != distinct || dupOnly != dups || all[consumerx.Processed] != distinct || all[consumerx.DeadLettered] != 0 {
		t.Errorf("%d entries ran, %d were acknowledged as duplicates (deliveries %v); want %d and %d", ran, dupOnly, all, distinct, dups)
	}
	if n := pending(t, e.rdb, stream, "billing"); n != 0 {
		t.Errorf("XPENDING = %d after the run", n)
	}
	t.Logf("%d entries, %d consumers: %s", distinct+dups, consumers, elapsed)
}

// A consumer whose context is cancelled after its effect and before its
// ack leaves the entry pending; another consumer takes it over with
// XAUTOCLAIM, finds it done and acknowledges it: one effect.
func TestKilledConsumerEntryReclaimed(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 42"}}).Err(); err != nil {
		t.Fatal(err)
	}
	var effects atomic.Int32
	killCtx, kill := context.WithCancel(ctx)
	a := e.consumer(func(ctx context.Context, msg consumerx.Message) error {
		effects.Add(1)
		kill() // the process dies right after the effect
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "a", MinIdle: 200 * time.Millisecond})
	if err := a.Run(killCtx); err != nil {
		t.Fatalf("a.Run: %v", err)
	}
	if effects.Load() != 1 {
		t.Fatalf("effects after a = %d", effects.Load())
	}
	p, err := e.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "billing", Start: "-", End: "+", Count: 10}).Result()
	if err != nil || len(p) != 1 || p[0].Consumer != "a" {
		t.Fatalf("pending after a = %+v, %v; want the entry pending at a", p, err)
	}

	var outs consumertest.Outcomes
	b := e.consumer(func(ctx context.Context, msg consumerx.Message) error {
		effects.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "b", MinIdle: 200 * time.Millisecond,
		ClaimEvery: 20 * time.Millisecond, Process: consumerx.Options{OnOutcome: outs.Hook}})
	snapshot := goleak.IgnoreCurrent()
	stop := e.run(b)
	testenv.WaitFor(t, 10*time.Second, "b to reclaim the entry", func() bool { return outs.Final()[consumerx.Duplicate] == 1 })
	testenv.WaitFor(t, 5*time.Second, "nothing pending", func() bool { return pending(t, e.rdb, stream, "billing") == 0 })
	stop()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	if n := effects.Load(); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// A handler that fails twice and then succeeds: retried through
// XAUTOCLAIM, processed once, on attempt 3.
func TestFailsTwiceThenSucceeds(t *testing.T) {
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	id, err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 7"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var calls, effects atomic.Int32
	var lastAttempt atomic.Int32
	c := e.consumer(func(ctx context.Context, msg consumerx.Message) error {
		lease, _ := consumerx.LeaseFrom(ctx)
		lastAttempt.Store(int32(lease.Attempt))
		if calls.Add(1) <= 2 {
			return fmt.Errorf("gateway timeout #%d", calls.Load())
		}
		effects.Add(1)
		return nil
	}, Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: 50 * time.Millisecond, ClaimEvery: 20 * time.Millisecond})
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the entry acknowledged", func() bool {
		return effects.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	if calls.Load() != 3 || effects.Load() != 1 || lastAttempt.Load() != 3 {
		t.Errorf("calls = %d, effects = %d, last attempt = %d; want 3, 1, 3", calls.Load(), effects.Load(), lastAttempt.Load())
	}
	key, err := c.Processor().Key(consumerx.Message{ID: ID(stream, id)})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := e.g.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != guard.StateCompleted || rec.Attempt != 3 {
		t.Errorf("record = %s after %d attempts, want completed after 3", rec.State, rec.Attempt)
	}
}

// A handler that always fails: after MaxAttempts runs the entry goes to the
// dead-letter stream once, with its last error, and is acknowledged.
func TestAlwaysFailsDeadLettered(t *testing.T) {
	e := newEnv(t, guard.Options{MaxAttempts: 3})
	ctx := context.Background()
	stream := e.prefix + "orders"
	id, err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"payload", "charge 9", "customer", "cus_1"}}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	var dead atomic.Int32
	var cause error
	c := e.consumer(func(ctx context.Context, msg consumerx.Message) error {
		return fmt.Errorf("card declined #%d", calls.Add(1))
	}, Options{Stream: stream, Group: "billing", Consumer: "c", MinIdle: 50 * time.Millisecond, ClaimEvery: 20 * time.Millisecond,
		Process: consumerx.Options{DeadLetter: func(ctx context.Context, msg consumerx.Message, err error) error {
			dead.Add(1)
			cause = err
			return nil
		}}})
	stop := e.run(c)
	testenv.WaitFor(t, 10*time.Second, "the entry dead-lettered and acknowledged", func() bool {
		return dead.Load() == 1 && pending(t, e.rdb, stream, "billing") == 0
	})
	// The entry is acknowledged: it does not come back, however many
	// reclaim rounds pass (this waits for time on a real server).
	time.Sleep(300 * time.Millisecond)
	stop()

	if calls.Load() != 3 || dead.Load() != 1 {
		t.Errorf("handler calls = %d, dead letters = %d; want 3, 1", calls.Load(), dead.Load())
	}
	var exh *guard.ExhaustedError
	if !errors.As(cause, &exh) || exh.Attempts != 3 || exh.LastError != "card declined #3" {
		t.Errorf("cause = %v, want *guard.ExhaustedError after 3 attempts with the last error", cause)
	}
	entries, err := e.rdb.XRange(ctx, stream+DeadLetterSuffix, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("dead-letter stream has %d entries, want 1", len(entries))
	}
	v := entries[0].Values
	if v[FieldDeadID] != id || v["payload"] != "charge 9" || v["customer"] != "cus_1" ||
		!strings.Contains(fmt.Sprint(v[FieldDeadError]), "card declined #3") || v[FieldDeadGroup] != "billing" {
		t.Errorf("dead-letter entry = %v", v)
	}
}

// The same entries under two groups: each group runs each message once.
func TestTwoGroupsOneEffectEach(t *testing.T) {
	const n = 200
	e := newEnv(t, guard.Options{})
	ctx := context.Background()
	stream := e.prefix + "orders"
	pipe := e.rdb.Pipeline()
	for i := range n {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"mid", fmt.Sprint(i), "payload", "p"}})
		if i%4 == 0 { // a duplicate of every fourth message
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"mid", fmt.Sprint(i), "payload", "p"}})
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	effects := map[string]int{} // group/mid → runs
	var cs []*Consumer
	for _, group := range []string{"billing", "shipping"} {
		for i := range 3 {
			cs = append(cs, e.consumer(func(ctx context.Context, msg consumerx.Message) error {
				mu.Lock()
				effects[group+"/"+msg.Metadata["mid"]]++
				mu.Unlock()
				return nil
			}, Options{Stream: stream, Group: group, Consumer: fmt.Sprint(i), MinIdle: time.Second, ClaimEvery: 100 * time.Millisecond,
				Process: consumerx.Options{Key: keyField}}))
		}
	}
	stop := e.run(cs...)
	testenv.WaitFor(t, 20*time.Second, "both groups done", func() bool {
		mu.Lock()
		done := len(effects) == 2*n
		mu.Unlock()
		return done && pending(t, e.rdb, stream, "billing") == 0 && pending(t, e.rdb, stream, "shipping") == 0
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	for _, group := range []string{"billing", "shipping"} {
		for i := range n {
			if got := effects[fmt.Sprintf("%s/%d", group, i)]; got != 1 {
				t.Errorf("%s ran message %d %d times", group, i, got)
			}
		}
	}
}

// Run returns soon after its context is cancelled, even while blocked in
// XREADGROUP, and leaves no goroutine.
func TestRunStopsOnCancel(t *testing.T) {
	e := newEnv(t, guard.Options{})
	c := e.consumer(func(context.Context, consumerx.Message) error { return nil },
		Options{Stream: e.prefix + "idle", Group: "g", Consumer: "c", Block: 200 * time.Millisecond})
	snapshot := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "the group created", func() bool {
		g, err := e.rdb.XInfoGroups(context.Background(), e.prefix+"idle").Result()
		return err == nil && len(g) == 1
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
}

func TestNewRejectsBadOptions(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})
	h := func(context.Context, consumerx.Message) error { return nil }
	for name, o := range map[string]Options{
		"no stream":   {Group: "g", Consumer: "c"},
		"no group":    {Stream: "s", Consumer: "c"},
		"no consumer": {Stream: "s", Group: "g"},
		"negative":    {Stream: "s", Group: "g", Consumer: "c", MinIdle: -1},
		"dead=stream": {Stream: "s", Group: "g", Consumer: "c", DeadLetterStream: "s"},
		"bad group":   {Stream: "s", Group: "g\x00", Consumer: "c"},
	} {
		if _, err := New(rdb, g, h, o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
	if _, err := New(rdb, nil, h, Options{Stream: "s", Group: "g", Consumer: "c"}); err == nil {
		t.Error("New accepted a nil guard")
	}
}
