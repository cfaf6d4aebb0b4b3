package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/redisstream"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/metrics"
	"github.com/idemguard/idemguard/pgstore"
	"github.com/idemguard/idemguard/promx"
)

// demoMetricsReady, when set (by tests), is called with the URL of the
// /metrics endpoint once it serves and again after both storms ran.
var demoMetricsReady func(url string, storms bool)

// demoTTL is how long the demo's guards remember a key.
const demoTTL = 10 * time.Minute

type demoConfig struct {
	redisAddr, pgDSN, metricsAddr string
	schema                        string
	log                           bool
	keys, copies, clients         int
	messages, consumers           int
	dupRate                       float64
	work, lease, wait             time.Duration
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo")
	var c demoConfig
	fs.StringVar(&c.redisAddr, "redis", "", "use the Redis at host:port instead of an embedded miniredis")
	fs.StringVar(&c.pgDSN, "postgres", "", "write the business effects and the SQL backstop to this PostgreSQL URL")
	fs.StringVar(&c.metricsAddr, "metrics", "", "serve Prometheus /metrics on this host:port while the demo runs")
	fs.StringVar(&c.schema, "schema", "", "PostgreSQL schema for the backstop and effects tables (default: the connection's search_path)")
	fs.BoolVar(&c.log, "log", false, "log every replay and conflict to stderr (log/slog, metrics.NewLogger)")
	fs.IntVar(&c.keys, "keys", 60, "HTTP: distinct idempotency keys")
	fs.IntVar(&c.copies, "copies", 4, "HTTP: copies of each request sent at once")
	fs.IntVar(&c.clients, "clients", 240, "HTTP: requests in flight at once")
	fs.IntVar(&c.messages, "messages", 300, "consumer: distinct messages")
	fs.Float64Var(&c.dupRate, "duplicates", 0.3, "consumer: fraction of messages delivered twice")
	fs.IntVar(&c.consumers, "consumers", 8, "consumer: consumers in the group")
	fs.DurationVar(&c.work, "work", 20*time.Millisecond, "how long each business effect takes")
	fs.DurationVar(&c.lease, "lease", 2*time.Second, "guard lease: how long a holder that died keeps its key")
	fs.DurationVar(&c.wait, "wait", 0, "HTTP: how long a copy whose key is in flight waits for the first copy's response (httpx.Options.Wait); 0 answers 409 at once")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case c.keys <= 0 || c.copies <= 0 || c.clients <= 0:
		return usagef("--keys, --copies and --clients must be positive")
	case c.messages <= 0 || c.consumers <= 0:
		return usagef("--messages and --consumers must be positive")
	case math.IsNaN(c.dupRate) || c.dupRate < 0 || c.dupRate > 1:
		return usagef("--duplicates %v: want a fraction between 0 and 1", c.dupRate)
	case c.work < 0:
		return usagef("--work %s must not be negative", c.work)
	case c.lease < 100*time.Millisecond:
		return usagef("--lease %s: want at least 100ms", c.lease)
	case c.wait < 0:
		return usagef("--wait %s must not be negative", c.wait)
	}
	if c.redisAddr != "" {
		if _, _, err := net.SplitHostPort(c.redisAddr); err != nil {
			return usagef("--redis %q: want host:port", c.redisAddr)
		}
	}
	if c.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.metricsAddr); err != nil {
			return usagef("--metrics %q: want host:port", c.metricsAddr)
		}
	}
	return demo(ctx, c, stdout, stderr)
}

// demoEffects records the business effects: in memory, or as rows of a
// PostgreSQL table when the demo has a database.
type demoEffects struct {
	run   string // the demo run the effects belong to
	table string // the PostgreSQL table of effects, when db is set
	mu    sync.Mutex
	runs  map[string]int
	db    *sql.DB
}

func (e *demoEffects) record(ctx context.Context, q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, kind, key string) error {
	if e.db != nil {
		_, err := q.ExecContext(ctx, `INSERT INTO `+e.table+` (run, kind, key) VALUES ($1, $2, $3)`, e.run, kind, key)
		return err
	}
	e.mu.Lock()
	e.runs[kind+"/"+key]++
	e.mu.Unlock()
	return nil
}

// count returns the effects of kind and the distinct keys they touched.
func (e *demoEffects) count(ctx context.Context, kind string) (effects, distinct int64, err error) {
	if e.db != nil {
		err = e.db.QueryRowContext(ctx, `SELECT count(*), count(DISTINCT key) FROM `+e.table+` WHERE run = $1 AND kind = $2`, e.run, kind).Scan(&effects, &distinct)
		return effects, distinct, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, n := range e.runs {
		if strings.HasPrefix(k, kind+"/") {
			effects += int64(n)
			distinct++
		}
	}
	return effects, distinct, nil
}

func demo(ctx context.Context, c demoConfig, stdout, stderr io.Writer) (err error) {
	start := time.Now()
	terminal := isTerminal(stderr)
	// Progress, logs and the metrics notice are written from several
	// goroutines: one lock keeps their lines whole.
	stderr = &lockedWriter{w: stderr}
	logger := slog.New(slog.DiscardHandler)
	// Every run has keys, messages and rows of its own: a second run on the
	// same servers starts from nothing.
	runID := strings.ToLower(rand.Text()[:8])
	prefix := "idemguard-demo:" + runID + ":"

	// Redis: embedded unless an address is given.
	addr, where := c.redisAddr, ""
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return fmt.Errorf("start embedded redis: %w", err)
		}
		defer mr.Close()
		// miniredis's keys expire only when told that time passed: tell it
		// as it passes, so a lease runs out as on a real Redis (a claim
		// whose answer came too late on a loaded machine would otherwise
		// hold its key for good).
		stopClock := realTime(mr)
		defer stopClock()
		addr, where = mr.Addr(), "embedded Redis (miniredis) on "+mr.Addr()+", nothing to install"
	} else {
		where = "Redis at " + addr
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 128, DialTimeout: connectTimeout, DialerRetries: 1})
	defer rdb.Close()
	pctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		return fmt.Errorf("redis at %s does not answer: %w", addr, err)
	}
	defer func() {
		// Leave nothing behind on a real server.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		iter := rdb.Scan(cctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(cctx) {
			rdb.Unlink(cctx, iter.Val())
		}
	}()
	store := guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: prefix})
	if err := store.LoadScripts(pctx); err != nil {
		return fmt.Errorf("load scripts into redis at %s: %w", addr, err)
	}

	effects := &demoEffects{run: runID, runs: map[string]int{}}
	var bs *backstop.Backstop
	if c.pgDSN != "" {
		db, err := openPostgres(ctx, c.pgDSN)
		if err != nil {
			return err
		}
		defer db.Close()
		db.SetMaxOpenConns(32)
		opts := pgstore.Options{Schema: c.schema, TTL: time.Hour}
		if err := opts.Validate(); err != nil {
			return usagef("--schema: %v", err)
		}
		if err := pgstore.Migrate(ctx, db, opts); err != nil {
			return fmt.Errorf("migrate the backstop schema: %w", err)
		}
		effects.table = "idemguard_demo_effects"
		if c.schema != "" {
			effects.table = `"` + c.schema + `".` + effects.table
		}
		for _, q := range []string{
			`CREATE TABLE IF NOT EXISTS ` + effects.table + ` (run text NOT NULL, kind text NOT NULL, key text NOT NULL, at timestamptz NOT NULL DEFAULT now())`,
			`DELETE FROM ` + effects.table + ` WHERE at < now() - interval '1 hour'`,
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("prepare the demo table: %w", err)
			}
		}
		effects.db = db
		if bs, err = backstop.New(db, opts); err != nil {
			return usagef("--schema: %v", err)
		}
		where += ", PostgreSQL (effects and the SQL backstop)"
	}

	reg := prometheus.NewRegistry()
	m, err := promx.New(reg, promx.Options{})
	if err != nil {
		return err
	}
	var observer guard.Observer = m
	if c.log {
		observer = metrics.Tee(m, metrics.NewLogger(slog.New(slog.NewTextHandler(stderr, nil)), metrics.LogOptions{}))
	}
	gopts := guard.Options{Observer: observer, Lease: c.lease, TTL: demoTTL}
	httpStore, consumerStore := m.Store(store), m.Store(store)
	if bs != nil {
		httpStore = backstop.Wrap(httpStore, bs)
		consumerStore = backstop.Wrap(consumerStore, bs)
	}
	httpGuard := guard.New(httpStore, gopts)
	consumerGuard := guard.New(consumerStore, gopts)

	if c.metricsAddr != "" {
		ln, err := net.Listen("tcp", c.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics: cannot listen on %s: %w", c.metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		url := "http://" + ln.Addr().String() + "/metrics"
		fmt.Fprintf(stderr, "metrics on %s while the demo runs\n", url)
		if demoMetricsReady != nil {
			demoMetricsReady(url, false)
			defer func() { demoMetricsReady(url, true) }()
		}
	}

	dupMessages := int(math.Round(float64(c.messages) * c.dupRate))
	total := c.keys*c.copies + c.messages + dupMessages
	prog := newProgress(stderr, total, terminal)

	fmt.Fprintf(stdout, "idemguard demo: %s\n\n", where)
	hs, err := httpStorm(ctx, c, httpGuard, bs, effects, logger, prog)
	if err != nil {
		return err
	}
	cs, err := consumerStorm(ctx, c, rdb, prefix, consumerGuard, bs, effects, logger, prog, dupMessages)
	prog.finish()
	if err != nil {
		return err
	}

	var failed []string
	fmt.Fprintf(stdout, "HTTP: POST /orders behind httpx.Guard, keys kept per customer; %d keys × %d copies sent at once by a retrying client (httpx.NewClient), each copy with a token of its own\n", c.keys, c.copies)
	if bs != nil {
		fmt.Fprintf(stdout, "  (each order and its response committed in one transaction: httpx.CommitResponse over backstop.Wrap)\n")
	}
	fmt.Fprintf(stdout, "  requests          %6d  (client calls, each answered with its key's first response)\n", hs.requests)
	fmt.Fprintf(stdout, "  attempts          %6d  (HTTP requests the server saw, retries included)\n", hs.attempts)
	fmt.Fprintf(stdout, "  executions        %6d  (handler runs)\n", hs.executions)
	fmt.Fprintf(stdout, "  replays           %6d  (answered from the stored response, Idempotent-Replayed: true)\n", hs.replays)
	fmt.Fprintf(stdout, "  conflicts         %6d  (409 while the first copy ran; the client asked again within a second)\n", hs.conflicts)
	failed = append(failed, verdict(stdout, "distinct keys", hs.effects, hs.distinct, int64(c.keys))...)
	if hs.mismatched > 0 {
		failed = append(failed, fmt.Sprintf("%d HTTP responses differ from their key's first", hs.mismatched))
	}
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "Consumer: a Redis Stream read by %d consumers of one group (consumerx/redisstream); %d messages, %d of them delivered twice\n", c.consumers, c.messages, dupMessages)
	fmt.Fprintf(stdout, "  deliveries        %6d  (entries handed to the wrapped handler, redeliveries included)\n", cs.deliveries)
	fmt.Fprintf(stdout, "  executions        %6d  (handler runs)\n", cs.processed)
	fmt.Fprintf(stdout, "  duplicates        %6d  (acknowledged without running)\n", cs.duplicates)
	fmt.Fprintf(stdout, "  conflicts         %6d  (in progress on another consumer: left pending, redelivered)\n", cs.inProgress)
	if cs.other > 0 {
		fmt.Fprintf(stdout, "  failed/dead       %6d\n", cs.other)
	}
	failed = append(failed, verdict(stdout, "distinct messages", cs.effects, cs.distinct, int64(c.messages))...)
	fmt.Fprintln(stdout)
	fmt.Fprintf(stdout, "guard outcomes: acquired %d, completed %d, replayed %d, in_progress %d, recovered %d, lease_lost %d\n",
		m.Count(guard.EventAcquired), m.Count(guard.EventCompleted), m.Count(guard.EventReplayed),
		m.Count(guard.EventInProgress), m.Count(guard.EventRecovered), m.Count(guard.EventLeaseLost))
	fmt.Fprintf(stdout, "done in %s\n", time.Since(start).Round(10*time.Millisecond))
	if len(failed) > 0 {
		return errors.New(strings.Join(failed, "; "))
	}
	return nil
}

// realTime moves mr's clock forward with the wall clock, every 50 ms,
// until the returned func is called (it waits for the ticking to stop).
func realTime(mr *miniredis.Miniredis) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				mr.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// verdict prints the effects line and returns what is wrong with it.
func verdict(w io.Writer, what string, effects, distinct, want int64) []string {
	ok := effects == distinct && distinct == want
	mark := "OK"
	if !ok {
		mark = "WRONG"
	}
	fmt.Fprintf(w, "  business effects  %6d == %s %d  %s\n", effects, what, want, mark)
	if ok {
		return nil
	}
	return []string{fmt.Sprintf("%d business effects for %d %s (%d touched)", effects, want, what, distinct)}
}

type httpStats struct {
	requests, attempts, executions, replays, conflicts int64
	effects, distinct, mismatched                      int64
}

func httpStorm(ctx context.Context, c demoConfig, g *guard.Guard, bs *backstop.Backstop, effects *demoEffects, logger *slog.Logger, prog *progress) (httpStats, error) {
	var st httpStats
	var attempts, executions, replays, conflicts, seq atomic.Int64
	var effectErr atomic.Value
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		executions.Add(1)
		key := r.Header.Get(httpx.DefaultHeader)
		if c.work > 0 {
			time.Sleep(c.work) // the business effect itself
		}
		body := fmt.Appendf(nil, `{"order":%q,"customer":%q,"number":%d}`, key, r.Context().Value(customerKey{}), seq.Add(1))
		w.Header().Set("Content-Type", "application/json")
		if bs == nil {
			if err := effects.record(r.Context(), effects.db, "http", key); err != nil {
				effectErr.Store(err)
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
			_, _ = w.Write(body)
			return
		}
		// The order and the response the client gets, in one transaction.
		tx, err := effects.db.BeginTx(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer tx.Rollback()
		if err := effects.record(r.Context(), tx, "http", key); err != nil {
			effectErr.Store(err)
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = httpx.CommitResponse(w, r, tx, bs, http.StatusCreated, body) // it answers in every outcome
	})
	mux := inventory.NewServeMux(inventory.New(inventory.Options{}), nil)
	demoRoutes(mux, g, c, logger, orders, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			attempts.Add(1)
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, r)
			switch {
			case sw.status == http.StatusConflict:
				conflicts.Add(1)
			case sw.Header().Get(httpx.ReplayedHeader) == "true":
				replays.Add(1)
			}
		})
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return st, fmt.Errorf("http: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/orders"

	base := &http.Transport{MaxIdleConns: c.clients, MaxIdleConnsPerHost: c.clients}
	defer base.CloseIdleConnections()
	client := httpx.NewClient(httpx.TransportOptions{Base: base, MaxAttempts: 100}) // bounded by the timeout below
	client.Timeout = 50 * time.Second

	// Copies of a key are next to each other in the queue, so they are in
	// flight together.
	answers := make([][]string, c.keys)
	for k := range answers {
		answers[k] = make([]string, c.copies)
	}
	jobs := make(chan [2]int)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range c.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				k, cp := j[0], j[1]
				key := "order-" + effects.run + "-" + strconv.Itoa(k)
				// Each copy has a token of its own (a client that refreshed
				// it between retries): the customer, not the token, scopes
				// the key.
				token := "cust-" + strconv.Itoa(k%5) + "." + strconv.Itoa(cp)
				body, err := post(ctx, client, url, key, token)
				if err != nil {
					select {
					case errs <- fmt.Errorf("http: POST %s: %w", key, err):
					default:
					}
					continue
				}
				answers[k][cp] = body
				prog.add(1)
			}
		}()
	}
feed:
	for k := range c.keys {
		for cp := range c.copies {
			select {
			case jobs <- [2]int{k, cp}:
			case err := <-errs:
				errs <- err
				break feed
			case <-ctx.Done():
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errs:
		return st, err
	default:
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if v := effectErr.Load(); v != nil {
		return st, fmt.Errorf("http: business effect: %w", v.(error))
	}
	for _, copies := range answers {
		for _, b := range copies[1:] {
			if b != copies[0] {
				st.mismatched++
			}
		}
	}
	st.requests = int64(c.keys * c.copies)
	st.attempts, st.executions, st.replays, st.conflicts = attempts.Load(), executions.Load(), replays.Load(), conflicts.Load()
	st.effects, st.distinct, err = effects.count(ctx, "http")
	return st, err
}

// demoRoutes registers the demo service's routes: POST /orders, seen
// first by observe, then authenticated, then behind httpx.Guard with keys
// kept per customer. `idemguard inventory` lists the same routes.
func demoRoutes(mux *inventory.ServeMux, g *guard.Guard, c demoConfig, logger *slog.Logger, orders http.Handler, observe func(http.Handler) http.Handler) {
	mux.Handle("POST /orders", orders, observe, authenticateCustomer,
		httpx.Guard(g, httpx.Options{Logger: logger, Wait: c.wait, Tenant: httpx.TenantFromContext[string](customerKey{}, nil)}))
}

func post(ctx context.Context, client *http.Client, url, key, token string) (string, error) {
	body := []byte(`{"item":"book","key":"` + key + `"}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set(httpx.DefaultHeader, key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return string(b), nil
}

// customerKey is where authenticateCustomer stores the customer.
type customerKey struct{}

// authenticateCustomer stands in for an authentication middleware: a
// bearer token "<customer>.<anything>" names its customer (a real one
// verifies the token). The customer goes into the request context, where
// httpx.TenantFromContext reads it.
func authenticateCustomer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		customer, _, found := strings.Cut(token, ".")
		if !ok || !found || customer == "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), customerKey{}, customer)))
	})
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

type consumerStats struct {
	deliveries, processed, duplicates, inProgress, other int64
	effects, distinct                                    int64
}

func consumerStorm(ctx context.Context, c demoConfig, rdb *redis.Client, prefix string, g *guard.Guard,
	bs *backstop.Backstop, effects *demoEffects, logger *slog.Logger, prog *progress, dups int) (consumerStats, error) {
	var st consumerStats
	stream := prefix + "orders"
	entries := c.messages + dups
	// Every message once; a duplicate (the same message id and payload, as a
	// producer retrying after a lost reply sends it) follows its original a
	// few entries later, so both are in flight on different consumers.
	order := make([]int, 0, entries)
	dupAfter := make(map[int][]int, dups) // original index → duplicates sent after it
	for j := range dups {
		id := j * c.messages / dups
		at := min(id+3, c.messages-1)
		dupAfter[at] = append(dupAfter[at], id)
	}
	for id := range c.messages {
		order = append(order, id)
		order = append(order, dupAfter[id]...)
	}
	for start := 0; start < len(order); start += 500 {
		_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range order[start:min(start+500, len(order))] {
				p.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{
					"msg_id", "msg-" + effects.run + "-" + strconv.Itoa(id), "payload", "ship order " + strconv.Itoa(id)}})
			}
			return nil
		})
		if err != nil {
			return st, fmt.Errorf("consumer: XADD: %w", err)
		}
	}

	fingerprint := func(m consumerx.Message) string {
		sum := sha256.Sum256(m.Payload)
		return hex.EncodeToString(sum[:])
	}
	var deliveries, processed, duplicates, inProgress, other, acked atomic.Int64
	var effectErr atomic.Value
	var ackedMu sync.Mutex
	ackedIDs := make(map[string]struct{}, entries)
	handler := func(ctx context.Context, m consumerx.Message) error {
		key := m.Metadata["msg_id"]
		run := func(ctx context.Context, q interface {
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		}) error {
			if err := effects.record(ctx, q, "consumer", key); err != nil {
				effectErr.Store(err)
				return err
			}
			if c.work > 0 {
				time.Sleep(c.work) // the business effect itself
			}
			return nil
		}
		if bs == nil {
			return run(ctx, nil)
		}
		// With PostgreSQL: the effect and the backstop row commit together.
		lease, _ := consumerx.LeaseFrom(ctx)
		tx, err := bs.DB().BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if err := run(ctx, tx); err != nil {
			return err
		}
		if err := bs.Commit(ctx, tx, lease, fingerprint(m), nil); err != nil {
			if errors.Is(err, backstop.ErrAlreadyCommitted) {
				return nil // committed before: roll this one back
			}
			return err
		}
		return tx.Commit()
	}
	opts := redisstream.Options{
		Logger: logger,
		Process: consumerx.Options{
			Fingerprint: fingerprint,
			Logger:      logger,
			OnOutcome: func(_ context.Context, m consumerx.Message, o consumerx.Outcome, _ error) {
				deliveries.Add(1)
				switch o {
				case consumerx.Processed:
					processed.Add(1)
				case consumerx.Duplicate:
					duplicates.Add(1)
				case consumerx.InProgress:
					inProgress.Add(1)
				default:
					other.Add(1)
				}
				// An entry may be delivered again after it was acknowledged
				// (reclaimed while its first consumer still ran it): count
				// each entry once.
				if o.Ack() {
					ackedMu.Lock()
					_, seen := ackedIDs[m.ID]
					ackedIDs[m.ID] = struct{}{}
					ackedMu.Unlock()
					if !seen {
						acked.Add(1)
						prog.add(1)
					}
				}
			},
		},
	}
	demoConsumer(&opts, stream, c)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	runErrs := make(chan error, c.consumers)
	for i := range c.consumers {
		o := opts
		o.Consumer = "consumer-" + strconv.Itoa(i)
		cons, err := redisstream.New(rdb, g, handler, o)
		if err != nil {
			return st, fmt.Errorf("consumer: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cons.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				runErrs <- err
			}
		}()
	}
	// Wait until every entry was acknowledged (polling the count, with a deadline).
	deadline := time.Now().Add(45 * time.Second)
	var waitErr error
	for acked.Load() < int64(entries) {
		if time.Now().After(deadline) {
			waitErr = fmt.Errorf("consumer: only %d of %d entries acknowledged after 45s", acked.Load(), entries)
			break
		}
		if v := effectErr.Load(); v != nil {
			waitErr = fmt.Errorf("consumer: business effect: %w", v.(error))
			break
		}
		select {
		case err := <-runErrs:
			waitErr = fmt.Errorf("consumer: %w", err)
		case <-ctx.Done():
			waitErr = ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if waitErr != nil {
			break
		}
	}
	stop()
	wg.Wait()
	if waitErr != nil {
		return st, waitErr
	}
	st.deliveries, st.processed, st.duplicates, st.inProgress, st.other =
		deliveries.Load(), processed.Load(), duplicates.Load(), inProgress.Load(), other.Load()
	var err error
	st.effects, st.distinct, err = effects.count(ctx, "consumer")
	return st, err
}

// demoConsumer sets what makes o one of the demo's consumers of stream:
// group "billing", each order message deduplicated by its msg_id field.
// `idemguard inventory` lists the same group.
func demoConsumer(o *redisstream.Options, stream string, c demoConfig) {
	o.Stream, o.Group, o.Block, o.Count = stream, "billing", 100*time.Millisecond, 4
	// An entry left pending (in progress elsewhere) comes back once the
	// holder's lease could have ended.
	o.MinIdle, o.ClaimEvery = c.lease, 100*time.Millisecond
	o.Process.Key = func(m consumerx.Message) (string, error) { return m.Metadata["msg_id"], nil }
	o.Process.MessageType = "order (Redis stream)"
}

// progress shows a bar on a terminal and a line every quarter otherwise.
type progress struct {
	bar   *progressbar.ProgressBar
	w     io.Writer
	total int64
	done  atomic.Int64
	mu    sync.Mutex
	shown int64 // quarters printed
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// lockedWriter serialises writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func newProgress(w io.Writer, total int, terminal bool) *progress {
	p := &progress{w: w, total: int64(total)}
	if terminal {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("storms"), progressbar.OptionShowCount(),
			progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(50*time.Millisecond))
	}
	return p
}

func (p *progress) add(n int) {
	d := p.done.Add(int64(n))
	if p.bar != nil {
		_ = p.bar.Add(n)
		return
	}
	q := d * 4 / max(p.total, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.shown < q && p.shown < 4 {
		p.shown++
		fmt.Fprintf(p.w, "progress: %d%% (%d of %d requests and messages)\n", p.shown*25, d, p.total)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
