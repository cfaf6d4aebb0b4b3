package proof

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// paySvc is a payments service set up as the README's "When Redis
// forgets" tells a user: httpx.Guard over backstop.Wrap(RedisStore,
// Backstop), the handler inserting a charge and ending with
// httpx.CommitResponse. Its Redis client dials whatever address addr
// holds, as a client behind a virtual IP or Sentinel would after a
// failover.
type paySvc struct {
	db   *sql.DB
	bs   *backstop.Backstop
	rs   *guard.RedisStore
	rdb  *redis.Client
	addr atomic.Pointer[string]
	srv  *httptest.Server
	cl   *http.Client

	status sync.Map // status code -> *atomic.Int64, as the server answered

	// hold is how long the handler takes after inserting its charge (a
	// call to the card network), so requests are in flight when Redis
	// loses them; declineFirst makes the first run of every key whose ID ends
	// in 0 answer
	// 503 after that time instead (a downstream that failed: 5xx releases
	// the key).
	hold         time.Duration
	declineFirst bool
	inflight     sync.Map // key ID -> *atomic.Int64: handler runs in progress
	runs         sync.Map // key ID -> *atomic.Int64: handler runs begun
	overlaps     atomic.Int64
}

func newPaySvc(t *testing.T, addr string, lease time.Duration) *paySvc {
	t.Helper()
	ctx := context.Background()
	s := &paySvc{}
	s.addr.Store(&addr)
	s.rdb = redis.NewClient(&redis.Options{Addr: addr, Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, *s.addr.Load())
	}})
	t.Cleanup(func() { _ = s.rdb.Close() })
	s.rs = guard.NewRedisStore(s.rdb, guard.RedisOptions{})
	if err := s.rs.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.rs.Check(ctx, guard.CheckOptions{}); err != nil {
		t.Fatal(err)
	}
	s.db, _ = testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, s.db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`CREATE TABLE charges (id bigint GENERATED ALWAYS AS IDENTITY, idem_key text NOT NULL, fence bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.bs, err = backstop.New(s.db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	g := guard.New(backstop.Wrap(s.rs, s.bs), guard.Options{Lease: lease})
	h := httpx.Guard(g, httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)})(http.HandlerFunc(s.charge))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &codeRecorder{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r)
		n, _ := s.status.LoadOrStore(rec.code, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}))
	t.Cleanup(s.srv.Close)
	base := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}
	t.Cleanup(base.CloseIdleConnections)
	s.cl = httpx.NewClient(httpx.TransportOptions{Base: base, MaxAttempts: 30})
	return s
}

type codeRecorder struct {
	http.ResponseWriter
	code int
}

func (r *codeRecorder) WriteHeader(code int) { r.code = code; r.ResponseWriter.WriteHeader(code) }

// charge is the README's handler.
func (s *paySvc) charge(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	defer tx.Rollback()
	lease, _, _ := httpx.ClaimFrom(ctx)
	n, _ := s.inflight.LoadOrStore(lease.Key.ID, new(atomic.Int64))
	if n.(*atomic.Int64).Add(1) > 1 {
		s.overlaps.Add(1) // another request of the key is in this handler
	}
	defer n.(*atomic.Int64).Add(-1)
	runs, _ := s.runs.LoadOrStore(lease.Key.ID, new(atomic.Int64))
	run := runs.(*atomic.Int64).Add(1)
	var id int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO charges (idem_key, fence) VALUES ($1, $2) RETURNING id`,
		lease.Key.ID, lease.Fence).Scan(&id); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	time.Sleep(s.hold) // the card network's answer: the workload, not synchronisation
	if s.declineFirst && run == 1 && strings.HasSuffix(lease.Key.ID, "0") {
		w.WriteHeader(http.StatusServiceUnavailable) // 5xx: key released, the charge rolled back
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/charges/"+strconv.FormatInt(id, 10))
	_ = httpx.CommitResponse(w, r, tx, s.bs, http.StatusCreated, fmt.Appendf(nil, `{"charge":%d}`, id))
}

// payCall is what one client call ended with.
type payCall struct {
	status int
	charge int64
	err    error
	took   time.Duration
}

func (s *paySvc) pay(id string, limit time.Duration) payCall {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/charges", strings.NewReader(`{"amount":500}`))
	req.Header.Set("Idempotency-Key", id)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.cl.Do(req)
	c := payCall{err: err}
	if err == nil {
		defer resp.Body.Close()
		c.status = resp.StatusCode
		var body struct{ Charge int64 }
		if json.NewDecoder(resp.Body).Decode(&body) == nil {
			c.charge = body.Charge
		}
	}
	c.took = time.Since(start)
	return c
}

func (s *paySvc) answers() string {
	var b strings.Builder
	s.status.Range(func(k, v any) bool {
		fmt.Fprintf(&b, "%d:%d ", k, v.(*atomic.Int64).Load())
		return true
	})
	return b.String()
}

// payStorm sends keys × copies concurrent retrying calls (parallel keys
// at a time), calling fault(n) after the n-th answered call, then asks
// every key once more. It fails the test unless each key has exactly one
// charge, every call and every final call answered 201 carrying that
// charge (or, for a call during the storm, a retryable 503 or 409 left
// after the client's retries), and the final calls all answered 201.
func payStorm(t *testing.T, s *paySvc, keys, copies, parallel int, fault func(n int)) (slowest time.Duration) {
	t.Helper()
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	calls := make([][]payCall, keys)
	var answered atomic.Int64
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range parallel {
		wg.Go(func() {
			for k := range jobs {
				calls[k] = make([]payCall, copies)
				var cw sync.WaitGroup
				for cp := range copies {
					cw.Go(func() {
						calls[k][cp] = s.pay(fmt.Sprintf("%s-%d", prefix, k), 60*time.Second)
						fault(int(answered.Add(1)))
					})
				}
				cw.Wait()
			}
		})
	}
	start := time.Now()
	for k := range keys {
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	took := time.Since(start)
	final := make([]payCall, keys)
	for k := range keys {
		final[k] = s.pay(fmt.Sprintf("%s-%d", prefix, k), 20*time.Second)
	}

	charged := map[string][]int64{}
	rows, err := s.db.Query(`SELECT idem_key, id FROM charges`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var id int64
		if err := rows.Scan(&k, &id); err != nil {
			t.Fatal(err)
		}
		charged[k] = append(charged[k], id)
	}
	rows.Close()
	nOK, nRetry, nBad, nDouble := 0, 0, 0, 0
	for k := range keys {
		id := fmt.Sprintf("%s-%d", prefix, k)
		ch := charged[id]
		if len(ch) != 1 {
			nDouble++
			t.Errorf("key %s: %d charges %v, want 1", id, len(ch), ch)
			continue
		}
		for i, c := range append(calls[k], final[k]) {
			slowest = max(slowest, c.took)
			switch {
			case c.err == nil && c.status == http.StatusCreated && c.charge == ch[0]:
				nOK++
			case i < copies && c.err == nil && (c.status == http.StatusServiceUnavailable || c.status == http.StatusConflict):
				nRetry++
			default:
				nBad++
				t.Errorf("key %s call %d (final %v): %d charge %d err %v after %s; the key's charge is %d",
					id, i, i == copies, c.status, c.charge, c.err, c.took, ch[0])
			}
		}
	}
	// The backstop's mark keeps a holder's lease: however Redis lost its
	// record, no second request of the key runs beside it.
	if n := s.overlaps.Load(); n > 0 {
		t.Errorf("%d handler runs began while another run of the same key was in progress", n)
	}
	t.Logf("%d keys × %d copies in %s: right answers %d, retryable left %d, wrong/none %d, keys not charged once %d, overlapping runs %d; slowest call %s; server answered %s",
		keys, copies, took.Round(time.Millisecond), nOK, nRetry, nBad, nDouble, s.overlaps.Load(), slowest.Round(time.Millisecond), s.answers())
	return slowest
}

// An operator switches Redis to allkeys-lru with a tiny maxmemory
// mid-storm: records and leases are evicted while requests run. The
// backstop must still hold every key to one charge.
func TestDrillPayEviction(t *testing.T) {
	t.Parallel() // a drill: see TestMain
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	s := newPaySvc(t, srv.Addr(), 5*time.Second)
	var done sync.WaitGroup
	payStorm(t, s, 160, 4, 40, func(n int) {
		if n == 160 {
			ctx := context.Background()
			if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
				t.Error(err)
			}
			if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Error(err)
			}
			done.Go(func() {
				time.Sleep(2 * time.Second)
				_ = admin.ConfigSet(context.Background(), "maxmemory", "0").Err()
			})
		}
	})
	done.Wait()
	ev, _ := admin.Info(context.Background(), "stats").Result()
	for line := range strings.SplitSeq(ev, "\r\n") {
		if strings.HasPrefix(line, "evicted_keys:") {
			t.Log(line)
		}
	}
	if err := s.rs.Check(context.Background(), guard.CheckOptions{}); err == nil {
		t.Errorf("Check after the switch to allkeys-lru: nil, want an error")
	} else {
		t.Logf("Check after the switch: %v", err)
	}
}

// The replica stops replicating at a quarter of the storm, the
// primary dies at half of it and the stale replica is promoted (REPLICAOF
// NO ONE): the service's client now reaches a Redis that lost every
// record, lease and fence counter written in between, while those
// requests may still be running.
func TestDrillPayFailover(t *testing.T) {
	t.Parallel() // a drill: see TestMain
	primary := testenv.StartRedis(t)
	replica := testenv.StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port()))
	radmin := replica.Client()
	testenv.WaitFor(t, 10*time.Second, "replica in sync", func() bool {
		info, _ := radmin.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})
	s := newPaySvc(t, primary.Addr(), 5*time.Second)
	payStorm(t, s, 160, 4, 40, func(n int) {
		switch n {
		case 160:
			// The replica stops replicating and keeps what it has (a
			// replica of a master that does not answer).
			if err := radmin.Do(context.Background(), "REPLICAOF", "127.0.0.1", strconv.Itoa(testenv.FreePort(t))).Err(); err != nil {
				t.Error(err)
			}
		case 320:
			primary.Kill()
			if err := radmin.Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
				t.Error(err)
			}
			a := replica.Addr()
			s.addr.Store(&a)
		}
	})
}

// Redis is flushed (FLUSHALL) at a quarter of the storm and killed at
// half of it, coming back empty a second later, while requests hold
// their keys for 1.5 s each (longer than a 409's Retry-After) and the first run of every tenth key fails
// (503, the key released). Redis loses the record of requests still in
// their handler; the backstop's mark keeps each holder's lease, so no
// other request of the key runs beside it (payStorm counts overlapping
// runs), and a failed or released holder's lease ends with it, so no key
// is refused for a lease (30 s) nobody holds.
func TestDrillPayFlush(t *testing.T) {
	t.Parallel() // a drill: see TestMain
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	const lease = 30 * time.Second
	s := newPaySvc(t, srv.Addr(), lease)
	s.hold, s.declineFirst = 1500*time.Millisecond, true
	var restarted sync.WaitGroup
	slowest := payStorm(t, s, 160, 4, 40, func(n int) {
		switch n {
		case 160:
			if err := admin.FlushAll(context.Background()).Err(); err != nil {
				t.Error(err)
			}
		case 320:
			srv.Kill()
			restarted.Go(func() {
				time.Sleep(time.Second) // the fault's schedule: down for a second
				srv.Restart()
			})
		}
	})
	restarted.Wait()
	if slowest > lease/2 {
		t.Errorf("slowest call %s: a key waited out a lease (%s) nobody held", slowest, lease)
	}
}
