package proof

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// These tests break a Redis server of their own (testenv.StartRedis):
// pause it, put it to sleep, lose a completion by promoting a replica, flush
// it. The backstop row keeps every effect single, and every answer the
// guard gives is one the history checker accepts.

func patientClient(t testing.TB, addr string, read time.Duration) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 8, ReadTimeout: read, WriteTimeout: read,
		DialTimeout: time.Second, MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// assertOneEffect checks key has exactly one business row and its record
// is completed with that row's value.
func assertOneEffect(t *testing.T, bk *bank, g *guard.Guard, key guard.Key) string {
	t.Helper()
	rows := bk.rows(t, key.Scope)[key.ID]
	if len(rows) != 1 {
		t.Fatalf("%s: %d business rows %q, want 1", key, len(rows), rows)
	}
	r, err := g.Get(context.Background(), key)
	if err != nil || r.State != guard.StateCompleted || string(r.Result) != rows[0] {
		t.Fatalf("%s: record %+v, %v; want completed with %q", key, r, err, rows[0])
	}
	return rows[0]
}

// CLIENT PAUSE WRITE for longer than the lease while a holder runs and a
// duplicate arrives: when the pause ends the holder's lease has run out;
// whoever wins, there is one effect and one completion.
func TestClientPauseLongerThanLease(t *testing.T) {
	srv := testenv.StartRedis(t)
	bk := newBank(t)
	const lease = 300 * time.Millisecond
	prefix := testenv.Prefix(t)
	rec := NewRecorder(guardenv.StoreOn(t, patientClient(t, srv.Addr(), 3*time.Second), guard.RedisOptions{Prefix: prefix}))
	g := guard.New(rec, guard.Options{Lease: lease, TTL: time.Hour})
	key := guard.Key{Scope: "pause", ID: "1"}
	ctx := context.Background()

	started, paused := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	var resA, resB guard.Result
	var errA, errB error
	wg.Add(1)
	go func() {
		defer wg.Done()
		eff := bk.effect("fp", 1)
		resA, errA = g.Do(WithClient(ctx, 0), key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			close(started)
			<-paused
			return eff(ctx, l)
		})
	}()
	<-started
	if err := srv.Client().Do(ctx, "CLIENT", "PAUSE", (3 * lease).Milliseconds(), "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { // a duplicate arrives during the pause
		defer wg.Done()
		resB, errB = g.Do(WithClient(ctx, 1), key, "fp", bk.effect("fp", 2))
	}()
	close(paused)
	wg.Wait()
	t.Logf("holder: %q, %v; duplicate: %q replayed=%t, %v", resA.Value, errA, resB.Value, resB.Replayed, errB)
	settle(t, WithClient(ctx, 2), g, key, "fp", bk.effect("fp", 3), 10*time.Second)
	v := assertOneEffect(t, bk, g, key)
	for who, r := range map[string]guard.Result{"holder": resA, "duplicate": resB} {
		if len(r.Value) > 0 && string(r.Value) != v {
			t.Errorf("%s answered %q, but the one effect is %q", who, r.Value, v)
		}
	}
	checkHistory(t, rec)
}

// DEBUG SLEEP blocks the whole server: a claim meanwhile gets
// ErrUnavailable (nothing is known), the holder's heartbeat cannot extend
// and cancels the effect with ErrLeaseLost before its lease could have
// been taken over; afterwards the key completes once.
func TestDebugSleep(t *testing.T) {
	srv := testenv.StartRedis(t)
	bk := newBank(t)
	const lease = 300 * time.Millisecond
	rec := NewRecorder(guardenv.StoreOn(t, patientClient(t, srv.Addr(), 100*time.Millisecond), guard.RedisOptions{Prefix: testenv.Prefix(t)}))
	g := guard.New(rec, guard.Options{Lease: lease, TTL: time.Hour})
	key := guard.Key{Scope: "sleep", ID: "1"}
	ctx := context.Background()

	started := make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := g.Do(WithClient(ctx, 0), key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			close(started)
			<-ctx.Done() // the effect waits; only a lost lease ends it
			return nil, context.Cause(ctx)
		})
		holder <- err
	}()
	<-started
	slept := make(chan error, 1)
	go func() { slept <- srv.Client().Do(ctx, "DEBUG", "SLEEP", "1").Err() }()
	// Wait until the server is asleep: a PING on a fresh connection times out.
	probe := patientClient(t, srv.Addr(), 50*time.Millisecond)
	for deadline := time.Now().Add(2 * time.Second); probe.Ping(ctx).Err() == nil; {
		if time.Now().After(deadline) {
			t.Fatal("the server never went to sleep")
		}
	}
	if _, err := g.Do(WithClient(ctx, 1), key, "fp", bk.effect("fp", 2)); !errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("Do while Redis sleeps: %v, want ErrUnavailable", err)
	}
	if err := <-holder; !errors.Is(err, guard.ErrLeaseLost) {
		t.Errorf("holder's effect ended with %v, want its context cancelled with ErrLeaseLost", err)
	}
	if err := <-slept; err != nil {
		t.Fatal(err)
	}
	settle(t, WithClient(ctx, 2), g, key, "fp", bk.effect("fp", 3), 10*time.Second)
	assertOneEffect(t, bk, g, key)
	checkHistory(t, rec)
}

// A master completes a key and dies before the write reaches its replica;
// the replica is promoted. The key is claimed again on the new master,
// the backstop stops the second effect, and the client gets the result
// stored by the first.
func TestReplicaPromotedBeforeReplicating(t *testing.T) {
	master := testenv.StartRedis(t)
	link := startProxy(t, master.Addr()) // the replication link runs through it
	_, port, _ := strings.Cut(link.Addr(), ":")
	replica := testenv.StartRedis(t, "--replicaof", "127.0.0.1", port)
	admin := replica.Client()
	ctx := context.Background()
	for deadline := time.Now().Add(10 * time.Second); ; {
		info, _ := admin.Info(ctx, "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica never synced:\n%s", info)
		}
		time.Sleep(20 * time.Millisecond) // polling the replica's state
	}
	bk := newBank(t)
	prefix := testenv.Prefix(t)
	key := guard.Key{Scope: "promote", ID: "order-7"}
	// Cut replication: the master's stream to the replica is dropped.
	if _, err := link.Add(Fault{Type: "timeout", Stream: "downstream", Attributes: map[string]any{"timeout": 0}}); err != nil {
		t.Fatal(err)
	}
	mc := master.Client()
	g1 := guard.New(guardenv.StoreOn(t, mc, guard.RedisOptions{Prefix: prefix}), guard.Options{Lease: time.Second, TTL: time.Hour})
	first, err := g1.Do(ctx, key, "fp", bk.effect("fp", 1))
	if err != nil || first.Replayed {
		t.Fatalf("first Do: %+v, %v", first, err)
	}
	master.Kill()
	if err := admin.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		t.Fatal(err)
	}
	g2 := guard.New(guardenv.StoreOn(t, admin, guard.RedisOptions{Prefix: prefix}), guard.Options{Lease: time.Second, TTL: time.Hour})
	if _, err := g2.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("promoted replica has the key (%v): the completion was replicated, the test proves nothing", err)
	}
	ran := false
	eff := bk.effect("fp", 2)
	second, err := g2.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		ran = true
		return eff(ctx, l)
	})
	if err != nil {
		t.Fatalf("Do on the promoted replica: %v", err)
	}
	if !ran {
		t.Fatal("the key was not claimed again on the promoted replica")
	}
	if string(second.Value) != string(first.Value) {
		t.Fatalf("client got %q after promotion, want the stored %q", second.Value, first.Value)
	}
	assertOneEffect(t, bk, g2, key)
	if third, err := g2.Do(ctx, key, "fp", eff); err != nil || !third.Replayed || string(third.Value) != string(first.Value) {
		t.Fatalf("after promotion: %+v, %v; want a replay of %q", third, err, first.Value)
	}
}

// FLUSHALL forgets every key: a completed key is claimed again and the
// backstop answers with its stored result; a key flushed while its holder
// runs is taken by another request, and of the two effects one commits.
func TestFlushAll(t *testing.T) {
	srv := testenv.StartRedis(t)
	bk := newBank(t)
	rec := NewRecorder(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{Prefix: testenv.Prefix(t)}))
	g := guard.New(rec, guard.Options{Lease: 5 * time.Second, TTL: time.Hour})
	ctx := context.Background()
	done := guard.Key{Scope: "flush", ID: "done"}
	first, err := g.Do(ctx, done, "fp", bk.effect("fp", 1))
	if err != nil {
		t.Fatal(err)
	}

	// A holder is mid-effect when Redis is flushed.
	running := guard.Key{Scope: "flush", ID: "running"}
	started, resume := make(chan struct{}), make(chan struct{})
	holder := make(chan guard.Result, 1)
	go func() {
		eff := bk.effect("fp", 2)
		res, err := g.Do(WithClient(ctx, 1), running, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			close(started)
			<-resume
			return eff(ctx, l)
		})
		t.Logf("holder flushed mid-effect: %q, %v", res.Value, err)
		holder <- res
	}()
	<-started
	if err := srv.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	other, err := g.Do(WithClient(ctx, 2), running, "fp", bk.effect("fp", 3))
	if err != nil {
		t.Fatalf("Do after the flush: %v", err)
	}
	close(resume)
	a := <-holder
	v := assertOneEffect(t, bk, g, running)
	if string(other.Value) != v || (len(a.Value) > 0 && string(a.Value) != v) {
		t.Fatalf("answers %q and %q, but the one effect is %q", a.Value, other.Value, v)
	}

	again, err := g.Do(ctx, done, "fp", bk.effect("fp", 4))
	if err != nil || string(again.Value) != string(first.Value) {
		t.Fatalf("completed key after FLUSHALL: %+v, %v; want its stored %q", again, err, first.Value)
	}
	assertOneEffect(t, bk, g, done)
	// FLUSHALL is outside the model (it erases the state): no history check.
}
