package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
	"github.com/idemguard/idemguard/metrics"
	"github.com/idemguard/idemguard/pgstore"
	"github.com/idemguard/idemguard/promx"
)

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

	// metricsReady, if set, is called with the URL of the /metrics
	// endpoint once it serves and again after both storms ran.
	metricsReady func(url string, storms bool)
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c, err := parseDemo(args, stderr)
	if err != nil {
		return err
	}
	return demo(ctx, c, stdout, stderr)
}

// parseDemo reads the demo's flags into a checked configuration.
func parseDemo(args []string, stderr io.Writer) (demoConfig, error) {
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
	// Ten seconds: every key is in flight at once, so one stall of the
	// process longer than the lease's first deadline (two thirds of it; a
	// loaded machine running -race tests stalled 2 s ones) would lose
	// them all, and their copies would run the effect again, as on a real
	// Redis. A holder that dies keeps its key that long.
	fs.DurationVar(&c.lease, "lease", 10*time.Second, "guard lease: how long a holder that died keeps its key")
	fs.DurationVar(&c.wait, "wait", 0, "HTTP: how long a copy whose key is in flight waits for the first copy's response (httpx.Options.Wait); 0 answers 409 at once")
	if err := parse(fs, args, stderr); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, usagef("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case c.schema != "" && c.pgDSN == "":
		return c, usagef("--schema needs --postgres")
	case c.keys <= 0 || c.copies <= 0 || c.clients <= 0:
		return c, usagef("--keys, --copies and --clients must be positive")
	case c.messages <= 0 || c.consumers <= 0:
		return c, usagef("--messages and --consumers must be positive")
	case math.IsNaN(c.dupRate) || c.dupRate < 0 || c.dupRate > 1:
		return c, usagef("--duplicates %v: want a fraction between 0 and 1", c.dupRate)
	case c.work < 0:
		return c, usagef("--work %s must not be negative", c.work)
	case c.lease < 100*time.Millisecond:
		return c, usagef("--lease %s: want at least 100ms", c.lease)
	case c.wait < 0:
		return c, usagef("--wait %s must not be negative", c.wait)
	}
	if c.redisAddr != "" {
		if _, _, err := net.SplitHostPort(c.redisAddr); err != nil {
			return c, usagef("--redis %q: want host:port", c.redisAddr)
		}
	}
	if c.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.metricsAddr); err != nil {
			return c, usagef("--metrics %q: want host:port", c.metricsAddr)
		}
	}
	if c.pgDSN != "" {
		if _, err := postgresConnector(c.pgDSN); err != nil {
			return c, err
		}
	}
	return c, nil
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
	// A Redis that answers but refuses writes (out of memory, a replica,
	// a role without them) is said so now, not after the client's retries.
	if err := rdb.Set(pctx, prefix+"write-check", "1", time.Second).Err(); err != nil {
		return fmt.Errorf("redis at %s refuses writes: %w", addr, err)
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
			effects.table = pgsql.QuoteIdent(c.schema) + "." + effects.table
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
	unreachable := &storeCause{}
	var observer guard.Observer = metrics.Tee(m, unreachable)
	if c.log {
		observer = metrics.Tee(m, unreachable, metrics.NewLogger(slog.New(slog.NewTextHandler(stderr, nil)), metrics.LogOptions{}))
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
		if c.metricsReady != nil {
			c.metricsReady(url, false)
			defer func() { c.metricsReady(url, true) }()
		}
	}

	dupMessages := int(math.Round(float64(c.messages) * c.dupRate))
	total := c.keys*c.copies + c.messages + dupMessages
	prog := newProgress(stderr, total, terminal)

	fmt.Fprintf(stdout, "idemguard demo: %s\n\n", where)
	hs, err := httpStorm(ctx, c, httpGuard, bs, effects, logger, prog)
	if err != nil {
		return unreachable.explain(err)
	}
	cs, err := consumerStorm(ctx, c, rdb, prefix, consumerGuard, bs, effects, logger, prog, dupMessages)
	prog.finish()
	if err != nil {
		return unreachable.explain(err)
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
	fmt.Fprintf(stdout, "guard outcomes: acquired %d, completed %d, replayed %d, in_progress %d, recovered %d, lease_lost %d, unavailable %d\n",
		m.Count(guard.EventAcquired), m.Count(guard.EventCompleted), m.Count(guard.EventReplayed),
		m.Count(guard.EventInProgress), m.Count(guard.EventRecovered), m.Count(guard.EventLeaseLost),
		m.Count(guard.EventUnavailable))
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

// storeCause keeps the last error of a store the guards could not use
// (EventUnavailable), so that a demo that fails for it says why: the
// HTTP answer a client gets (503, "Idempotency store unavailable") keeps
// the cause to the server, and a Redis out of memory or refusing writes
// looked like a bug of the demo's.
type storeCause struct{ last atomic.Pointer[error] }

func (s *storeCause) Observe(_ context.Context, e guard.Event) {
	if e.Kind == guard.EventUnavailable && e.Err != nil {
		s.last.Store(&e.Err)
	}
}

// explain adds the last store error to err, if there was one.
func (s *storeCause) explain(err error) error {
	if cause := s.last.Load(); cause != nil {
		return fmt.Errorf("%w (the guard's store was unavailable: %v)", err, *cause)
	}
	return err
}
