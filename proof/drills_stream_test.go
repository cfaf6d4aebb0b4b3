package proof

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/redisstream"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// streamDrill runs two redisstream consumers of one group over a stream
// of orders, 30 % of the entries a second XADD of an earlier order (same
// order_id and payload), the guard's records in a Redis of their own
// (guardSrv, through a client that dials what addr holds) and the effect
// committed with pgstore.Store.Consume in its own transaction, as the
// README's consumer backstop. fault(n) runs after the n-th effect. It
// fails unless every order's effect ran exactly once, every entry was
// acknowledged, nothing went to the dead-letter stream, and all of that
// within 30 s of the last XADD.
func streamDrill(t *testing.T, guardAddr string, lease time.Duration, fault func(n int, addr *atomic.Pointer[string])) {
	t.Helper()
	const orders, dupPct = 300, 30
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streamSrv := testenv.StartRedis(t) // the stream's Redis is not faulted
	sc := streamSrv.Client()

	var addr atomic.Pointer[string]
	addr.Store(&guardAddr)
	gc := redis.NewClient(&redis.Options{Addr: guardAddr, Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, *addr.Load())
	}})
	t.Cleanup(func() { _ = gc.Close() })
	rs := guard.NewRedisStore(gc, guard.RedisOptions{})
	if err := rs.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rs.Check(ctx, guard.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	g := guard.New(rs, guard.Options{Lease: lease})

	db, _ := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE shipments (order_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	ps, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}

	var effects, handled, caught atomic.Int64
	handler := func(ctx context.Context, msg consumerx.Message) error {
		handled.Add(1)
		id := msg.Metadata["order_id"]
		ran, err := ps.Consume(ctx, "shipping", id, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, id)
			return err
		})
		if err != nil {
			return err
		}
		if !ran {
			caught.Add(1) // the guard let a duplicate through; the backstop caught it
			return nil
		}
		fault(int(effects.Add(1)), &addr)
		return nil
	}
	var runs sync.WaitGroup
	for i := range 2 {
		c, err := redisstream.New(sc, g, handler, redisstream.Options{
			Stream: "orders", Group: "shipping", Consumer: "c" + strconv.Itoa(i),
			Concurrency: 4, MinIdle: 2 * time.Second, Block: 200 * time.Millisecond,
			Process: consumerx.Options{
				Key:    func(msg consumerx.Message) (string, error) { return msg.Metadata["order_id"], nil },
				Logger: testenv.Logger(t),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		runs.Go(func() {
			if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("Run: %v", err)
			}
		})
	}

	// The producer: every order once, 30 % of them a second time a few
	// entries later, paced so that the faults meet traffic.
	sent := 0
	for i := range orders {
		ids := []int{i}
		if i%100 < dupPct && i > 0 {
			ids = append(ids, i/2) // a copy of an order sent long before
		}
		for _, o := range ids {
			if err := sc.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: map[string]any{
				"order_id": "o-" + strconv.Itoa(o), "payload": "ship " + strconv.Itoa(o)}}).Err(); err != nil {
				t.Fatal(err)
			}
			sent++
		}
		if i%10 == 9 {
			time.Sleep(20 * time.Millisecond) // pacing the producer, not synchronisation
		}
	}

	settled := func() bool {
		groups, err := sc.XInfoGroups(ctx, "orders").Result()
		if err != nil || len(groups) != 1 {
			return false
		}
		return groups[0].Lag == 0 && groups[0].Pending == 0
	}
	deadline := time.Now().Add(30 * time.Second)
	for !settled() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polling another process's state: there is no event to wait on
	}
	cancel()
	runs.Wait()

	var rows, distinct int
	if err := db.QueryRow(`SELECT count(*), count(DISTINCT order_id) FROM shipments`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	dead, _ := sc.XLen(context.Background(), "orders:dead").Result()
	groups, _ := sc.XInfoGroups(context.Background(), "orders").Result()
	var lag, pending int64 = -1, -1
	if len(groups) == 1 {
		lag, pending = groups[0].Lag, groups[0].Pending
	}
	t.Logf("%d entries for %d orders: effects %d for %d orders, handler calls %d, duplicates caught by the SQL row %d, dead letters %d, group lag %d, pending %d",
		sent, orders, rows, distinct, handled.Load(), caught.Load(), dead, lag, pending)
	if rows != orders || distinct != orders {
		t.Errorf("%d effects for %d orders, want %d for %d", rows, distinct, orders, orders)
	}
	if dead != 0 {
		msgs, _ := sc.XRange(context.Background(), "orders:dead", "-", "+").Result()
		var causes []string
		for _, m := range msgs {
			causes = append(causes, fmt.Sprint(m.Values["dead_error"]))
		}
		t.Errorf("%d entries dead-lettered: %s", dead, strings.Join(causes, "; "))
	}
	if lag != 0 || pending != 0 {
		t.Errorf("group lag %d pending %d after 30 s, want 0 and 0", lag, pending)
	}
}

// The guard's Redis is killed after 100 effects and restarted empty.
func TestDrillStreamRestartEmpty(t *testing.T) {
	t.Parallel() // a drill: see TestMain
	srv := testenv.StartRedis(t)
	var once sync.Once
	var done sync.WaitGroup
	streamDrill(t, srv.Addr(), 2*time.Second, func(n int, _ *atomic.Pointer[string]) {
		if n == 100 {
			once.Do(func() {
				srv.Kill()
				done.Go(func() { time.Sleep(500 * time.Millisecond); srv.Restart() })
			})
		}
	})
	done.Wait()
}

// The guard's Redis is flushed after 100 and after 200 effects.
func TestDrillStreamFlushAll(t *testing.T) {
	t.Parallel() // a drill: see TestMain
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	streamDrill(t, srv.Addr(), 2*time.Second, func(n int, _ *atomic.Pointer[string]) {
		if n == 100 || n == 200 {
			if err := admin.FlushAll(context.Background()).Err(); err != nil {
				t.Error(err)
			}
		}
	})
}

// The guard's Redis is switched to allkeys-lru with a tiny maxmemory for a
// second after 100 effects: records and leases are evicted.
func TestDrillStreamEviction(t *testing.T) {
	t.Parallel() // a drill: see TestMain
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	var done sync.WaitGroup
	streamDrill(t, srv.Addr(), 2*time.Second, func(n int, _ *atomic.Pointer[string]) {
		if n == 100 {
			_ = admin.ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err()
			_ = admin.ConfigSet(context.Background(), "maxmemory", "1").Err()
			done.Go(func() {
				time.Sleep(time.Second)
				_ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err()
			})
		}
	})
	done.Wait()
}

// The guard's replica stops replicating after 80 effects; after 160 the
// primary dies and the stale replica is promoted.
func TestDrillStreamFailover(t *testing.T) {
	t.Parallel() // a drill: see TestMain
	primary := testenv.StartRedis(t)
	replica := testenv.StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	radmin := replica.Client()
	testenv.WaitFor(t, 10*time.Second, "replica in sync", func() bool {
		info, _ := radmin.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})
	streamDrill(t, primary.Addr(), 2*time.Second, func(n int, addr *atomic.Pointer[string]) {
		switch n {
		case 80:
			// The replica stops replicating and keeps what it has (a
			// replica of a master that does not answer).
			if err := radmin.Do(context.Background(), "REPLICAOF", "127.0.0.1", strconv.Itoa(testenv.FreePort(t))).Err(); err != nil {
				t.Error(err)
			}
		case 160:
			primary.Kill()
			if err := radmin.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
				t.Error(err)
			}
			a := replica.Addr()
			addr.Store(&a)
		}
	})
}
