// Package gateway is `idemguard serve`: a reverse proxy that puts
// httpx.Guard in front of an HTTP service written in any language.
//
// The routes the configuration lists are guarded: a request's key is
// claimed in Redis, the request is forwarded (net/http/httputil
// ReverseProxy), the upstream's answer is stored and replayed to every
// retry with the same key; the upstream sees each key's request at most
// once. Everything else is passed through untouched (besides the
// X-Forwarded-* fields).
//
// # When the gateway cannot know
//
// The upstream knows nothing of idempotency. Once a request may have
// reached it, its effect may have happened, so the gateway follows
// Stripe's rule (the result is saved once execution began, 500s included):
// nothing that happens after the request may have been delivered frees
// its key for a re-run. Just before the first byte of a guarded request is
// written to the upstream, the gateway records a recovery point, the step
// "forward", with the key's record (guard.Step); nothing is written until
// it is stored. Then:
//
//   - no step recorded by this attempt means nothing was sent (the dial
//     failed, the gateway stopped first), and so does a step whose writes
//     all failed with no byte written: the key is released and the
//     answer is 503 not-forwarded with Retry-After;
//   - after the step, the upstream's answer, whatever its status, is the
//     key's result; a failure (broken connection, timeout, lost lease)
//     stores a 500 upstream-outcome-unknown problem as the key's
//     result (unknown_outcome: answer), or releases the key for a resend
//     with the same derived Idempotency-Key (unknown_outcome: resend, for
//     upstreams that deduplicate);
//   - with unknown_outcome: resend, one answer is not the key's result: 409
//     or 429 with Retry-After, the upstream saying its run of the derived
//     key is still in progress (a resend reached it before its first run
//     ended). It goes to the client as it came and the key is released, so
//     the retry resends and gets the upstream's real answer. With
//     unknown_outcome: answer the upstream is not taken to deduplicate:
//     that answer is stored like any other (upstreambusy.go);
//   - a gateway killed between forwarding and storing leaves the key
//     pending until its lease runs out; the claim that recovers it finds
//     the step and answers upstream-outcome-unknown (or resends), never
//     forwarding blindly again.
//
// Every guarded request carries a key derived from the client's
// (Lease.KeyFor("forward"): the same in every attempt, scoped by caller),
// so an upstream that can deduplicate does.
package gateway

import (
	"context"
	"crypto/tls"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lib/pq" // the PostgreSQL driver, for the secondary store
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/metrics"
	"github.com/idemguard/idemguard/pgstore"
	"github.com/idemguard/idemguard/promx"
)

// Options are what New needs besides the configuration. The zero value
// connects to the configured Redis and logs to stderr.
type Options struct {
	// Logger receives the gateway's structured log. Default: the
	// configuration's log section, to Stderr.
	Logger *slog.Logger
	// Stderr is where the default logger writes. Default io.Discard.
	Stderr io.Writer
	// Store replaces the configured Redis (and fallback) with another
	// store: --print-inventory passes an in-memory one, so nothing is
	// connected to. Health checks then report the store as not Redis.
	Store guard.Store

	// dial replaces the upstream dialer (tests).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Gateway is a running configuration: the proxy's handler, the admin
// handler and their store. Close releases what New opened.
type Gateway struct {
	cfg       *Config
	log       *slog.Logger
	evictLog  *slog.Logger // the eviction warning's: once per change (warnOnChange)
	evictLast *lastRecord  // evictLog's last warning (checkEviction)
	errorLog  *log.Logger
	store     guard.Store
	redis     redis.UniversalClient // nil with Options.Store
	rstore    *guard.RedisStore     // nil with Options.Store
	fb        *fallback.Store       // nil without a fallback policy
	db        *sql.DB               // the secondary's, if any
	secondary *scopedSecondary      // the fallback PostgreSQL store, if any (secondaryscope.go)
	reg       *prometheus.Registry
	metrics   *gatewayMetrics
	transport *gatedTransport
	inv       *inventory.Inventory
	handler   http.Handler
	admin     *http.ServeMux
	routes    []*route
	sessions  sessionSet // switched sessions running

	hardStop     context.Context // cancelled when in-flight requests must end
	stopRequests context.CancelCauseFunc
	stopping     atomic.Bool
}

// New builds the gateway cfg describes. It opens the Redis client (and the
// secondary's database) but does not reach them: Serve checks them.
func New(cfg *Config, opts Options) (*Gateway, error) {
	gw := &Gateway{cfg: cfg, reg: prometheus.NewRegistry(), inv: inventory.New(inventory.Options{})}
	gw.log = opts.Logger
	if gw.log == nil {
		w := opts.Stderr
		if w == nil {
			w = io.Discard
		}
		ho := &slog.HandlerOptions{Level: cfg.Log.Level}
		if cfg.Log.Format == "text" {
			gw.log = slog.New(slog.NewTextHandler(w, ho))
		} else {
			gw.log = slog.New(slog.NewJSONHandler(w, ho))
		}
	}
	gw.errorLog = slog.NewLogLogger(gw.log.Handler(), slog.LevelWarn)
	gw.evictLast = new(lastRecord)
	gw.evictLog = slog.New(&warnOnChange{next: gw.log.Handler(), last: gw.evictLast})
	gw.hardStop, gw.stopRequests = context.WithCancelCause(context.Background())
	gw.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gm, err := promx.New(gw.reg, promx.Options{})
	if err != nil {
		return nil, err
	}
	gw.metrics = newGatewayMetrics(gw.reg)

	if opts.Store != nil {
		gw.store = opts.Store
	} else if err := gw.openStore(); err != nil {
		return nil, err
	}
	// Timed by promx, which forwards the steps (guard.Step, the forward
	// step), batches and deadlines of the store under it.
	store := gm.Store(gw.store)
	observer := metrics.Tee(gm, metrics.NewLogger(gw.log, metrics.LogOptions{LogKeys: cfg.Log.Keys}))
	gw.transport = newTransport(cfg, opts.dial)

	mux := inventory.NewServeMux(gw.inv, nil)
	var verify *verifier
	if cfg.JWT != nil {
		verify = newVerifier(cfg.JWT)
	}
	loose := http.NewServeMux()               // variants.go
	byUpstream := map[string]*http.ServeMux{} // hosts.go
	var chains []http.Handler                 // prefixes.go
	anyHost := false
	for _, rc := range cfg.Routes {
		g := guard.New(store, guard.Options{TTL: rc.TTL, Lease: rc.Lease, MaxRun: rc.Timeout + rc.Lease, Observer: observer})
		rt := &route{gw: gw, cfg: rc, name: rc.Pattern, methods: map[string]bool{}}
		for _, m := range rc.Methods {
			rt.methods[m] = true
		}
		rt.proxy = gw.newProxy(rt, rc.Upstream)
		mw := []func(http.Handler) http.Handler{rt.outer}
		if rc.Caller.JWT != "" {
			mw = append(mw, verify.middleware(func(r *http.Request, err error) {
				gw.log.Debug("gateway: JWT not accepted; the caller is unknown", "method", r.Method, "path", r.URL.Path, "err", err)
			}))
		}
		mw = append(mw, httpx.Guard(g, gw.httpxOptions(rc)))
		mux.Handle(rc.Pattern, rt, mw...)
		gw.routes = append(gw.routes, rt)
		var chain http.Handler = rt
		for i := len(mw) - 1; i >= 0; i-- {
			chain = mw[i](chain)
		}
		chains = append(chains, chain)
		tryHandle(loose, loosePattern(rc.Pattern), variantRoute{rt: rt, handler: chain}) // checkPatterns refused conflicts
		patterns, host := hostless(rc)
		anyHost = anyHost || host
		rt.host = host
		um := byUpstream[upstreamID(rc.Upstream)]
		if um == nil {
			um = http.NewServeMux()
			byUpstream[upstreamID(rc.Upstream)] = um
		}
		for _, p := range patterns {
			tryHandle(um, p, variantRoute{rt: rt, handler: chain, host: host}) // checkHostScopes refused conflicts
		}
	}
	if !anyHost {
		byUpstream = nil
	}
	guarded := map[string]bool{}
	byPattern := map[string]*route{}
	for _, rt := range gw.routes {
		byPattern[rt.cfg.Pattern] = rt
		for m := range rt.methods {
			guarded[m] = true
		}
	}
	if !routesMatchEverything(cfg.Routes) {
		mux.Handle("/", gw.newProxy(nil, cfg.Upstream))
	}
	vm := &variantMux{main: mux.Mux(), loose: loose, next: mux, methods: guarded, routes: byPattern,
		byUpstream: byUpstream, passThrough: upstreamID(cfg.Upstream),
		byServer: gw.prefixes(gw.routes, chains), passThroughURL: cfg.Upstream}
	// guards reports whether a route guards r sent with method m.
	guards := func(r *http.Request, m string) bool {
		if !guarded[m] {
			return false
		}
		rm := r.WithContext(r.Context())
		rm.Method = m
		if _, p := mux.Mux().Handler(rm); byPattern[p] != nil && byPattern[p].methods[m] {
			return true
		}
		vr, ok := vm.match(rm)
		return ok && vr.rt.methods[m]
	}
	var methods []string
	maxBody := int64(DefaultMaxBody)
	for m := range guarded {
		methods = append(methods, m)
	}
	for _, rc := range cfg.Routes {
		maxBody = max(maxBody, rc.MaxBody)
	}
	served := methodVariants(guards, methods, maxBody, vm)

	gw.admin = http.NewServeMux()
	gw.admin.HandleFunc("GET /healthz", gw.healthz)
	gw.admin.HandleFunc("GET /readyz", gw.readyz)
	gw.admin.Handle("GET /metrics", promhttp.HandlerFor(gw.reg, promhttp.HandlerOpts{}))
	if cfg.AdminListen == "" {
		for _, p := range []string{"GET /healthz", "GET /readyz", "GET /metrics"} {
			mux.Mux().Handle(p, gw.admin)
		}
	} else {
		gw.admin.Handle("GET /inventory", gw.inv.Handler())
	}
	gw.handler = gw.bodyTimeout(gw.trackSessions(served))
	return gw, nil
}

// httpxOptions are the options of a route's httpx.Guard.
func (gw *Gateway) httpxOptions(rc Route) httpx.Options {
	o := httpx.Options{
		Methods:           rc.Methods,
		Optional:          rc.Required == inventory.RequireSoft,
		MaxBody:           rc.MaxBody,
		MaxStoredResponse: rc.MaxStoredResponse,
		// Stripe's rule: the upstream's answer is the result, 5xx too.
		// Failures before anything was sent release the key themselves.
		Store5xx: true,
		Wait:     rc.Wait,
		Logger:   gw.log,
		LogKeys:  gw.cfg.Log.Keys,
	}
	switch {
	case rc.Key.Body != "":
		o.Key = httpx.KeyFromBody(rc.Key.Body)
	case rc.Key.Computed:
		o.Key = httpx.ComputedKey(rc.Key.ComputedHeaders...)
	default:
		o.Header = rc.Key.Header
	}
	switch c := rc.Caller; {
	case c.Single:
		o.SingleCaller = true
	case c.Header != "":
		o.Tenant, o.CallerScope = headerTenant(c.Header), c.Scope
	case c.JWT == "sub":
		o.Tenant, o.CallerScope = httpx.TenantFromJWT(claimsKey{}), c.Scope
	default:
		o.Tenant, o.CallerScope = httpx.TenantFromContext(claimsKey{}, claimTenant(c.JWT)), c.Scope
	}
	return o
}

// routesMatchEverything reports whether a route's pattern matches every
// request ("/", "/{path...}"): that route passes its other methods through
// itself, and ServeMux refuses the pass-through's "/" beside it.
func routesMatchEverything(routes []Route) bool {
	mux := http.NewServeMux()
	for _, r := range routes {
		tryHandle(mux, r.Pattern)
	}
	return tryHandle(mux, "/") != ""
}

// headerTenant names the caller by a header the authentication layer in
// front sets. A request with the field twice names no one (the layer must
// replace a client's own value, not add to it).
func headerTenant(name string) func(*http.Request) string {
	return func(r *http.Request) string {
		v := r.Header.Values(name)
		if len(v) != 1 {
			return ""
		}
		return strings.TrimSpace(v[0])
	}
}

// openStore connects the configured Redis and wraps it in the fallback
// policy.
func (gw *Gateway) openStore() error {
	rc := gw.cfg.Redis
	var tlsCfg *tls.Config
	if rc.TLS {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	switch rc.Mode {
	case "cluster":
		gw.redis = redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Addrs, Username: rc.Username,
			Password: rc.Password, PoolSize: rc.PoolSize, TLSConfig: tlsCfg})
	case "sentinel":
		gw.redis = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: rc.MasterName, SentinelAddrs: rc.Addrs,
			SentinelPassword: rc.SentinelPassword, Username: rc.Username, Password: rc.Password, DB: rc.DB,
			PoolSize: rc.PoolSize, TLSConfig: tlsCfg})
	default:
		gw.redis = redis.NewClient(&redis.Options{Addr: rc.Addrs[0], Username: rc.Username, Password: rc.Password,
			DB: rc.DB, PoolSize: rc.PoolSize, TLSConfig: tlsCfg})
	}
	gw.rstore = guard.NewRedisStore(gw.redis, guard.RedisOptions{Prefix: rc.Prefix})
	fc := gw.cfg.Fallback
	if fc.Policy == "none" {
		gw.store = gw.rstore
		return nil
	}
	fo := fallback.Options{Timeout: fc.Timeout, OpenTimeout: fc.OpenTimeout, FailuresToOpen: fc.FailuresToOpen, Logger: gw.log}
	if !gw.cfg.Log.Keys {
		fo.Logger = slog.New(keyDigests{gw.log.Handler()})
	}
	switch fc.Policy {
	case "fail-open":
		fo.Policy = fallback.FailOpen
	case "secondary":
		pcfg, err := pq.NewConfig(fc.PostgresDSN)
		if err != nil {
			return fmt.Errorf("fallback: postgres: %w", err)
		}
		if pcfg.ConnectTimeout <= 0 {
			// lib/pq ignores the context while it waits for the server's
			// first answer: a server that accepts and never answers would
			// hang every request the secondary serves.
			pcfg.ConnectTimeout = secondaryConnectTimeout
		}
		conn, err := pq.NewConnectorConfig(pcfg)
		if err != nil {
			return fmt.Errorf("fallback: postgres: %w", err)
		}
		db := sql.OpenDB(conn)
		// During an outage every request comes here: database/sql keeps
		// 2 idle connections unless told otherwise, and the rest of the
		// statements would each open and close one (pgstore's doc).
		db.SetMaxIdleConns(secondaryIdleConns)
		// And no more than that open: a storm waits for a connection
		// (within the secondary's timeout, then 503) rather than open a
		// PostgreSQL backend per request and exhaust max_connections.
		db.SetMaxOpenConns(secondaryIdleConns)
		gw.db = db
		pg, err := pgstore.New(db, pgstore.Options{Schema: fc.Schema})
		if err != nil {
			return fmt.Errorf("fallback: %w", err)
		}
		// Keys go in under the Redis prefix: gateways of other services
		// may share this PostgreSQL (secondaryscope.go).
		gw.secondary = newScopedSecondary(pg, rc.Prefix)
		fo.Policy, fo.Secondary = fallback.Secondary, gw.secondary
	}
	fb, err := fallback.New(gw.rstore, fo)
	if err != nil {
		return err
	}
	gw.fb, gw.store = fb, fb
	return nil
}

// secondaryConnectTimeout bounds a connection to the fallback PostgreSQL
// whose DSN sets no connect_timeout of its own.
const secondaryConnectTimeout = 5 * time.Second

// secondaryIdleConns is how many idle connections to the fallback
// PostgreSQL the gateway keeps for the next requests.
const secondaryIdleConns = 64

// Handler is the proxy: the guarded routes, the pass-through, and (without
// admin_listen) /healthz, /readyz and /metrics.
func (gw *Gateway) Handler() http.Handler { return gw.handler }

// Admin serves /healthz, /readyz, /metrics and /inventory.
func (gw *Gateway) Admin() http.Handler { return gw.admin }

// Inventory is the route table the gateway enforces.
func (gw *Gateway) Inventory() *inventory.Inventory { return gw.inv }

// Close closes the store's clients and the upstream connections.
func (gw *Gateway) Close() error {
	gw.stopRequests(errShuttingDown)
	gw.transport.t.CloseIdleConnections()
	var errs []error
	if gw.redis != nil {
		errs = append(errs, gw.redis.Close())
	}
	if gw.db != nil {
		errs = append(errs, gw.db.Close())
	}
	return errors.Join(errs...)
}

// Prepare loads the scripts and checks Redis's eviction policy, as Serve
// does at start. An unsafe policy is an error (unless accept_eviction);
// a Redis that cannot be reached is not (readiness reports it). Under
// fallback policy secondary it also reads whether PostgreSQL holds keys
// from an outage, and if so checks claims against it (secondary.go).
func (gw *Gateway) Prepare(ctx context.Context) error {
	if gw.rstore == nil {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := gw.rstore.LoadScripts(rctx)
	if err == nil {
		err = gw.checkEviction(rctx)
	}
	switch {
	case errors.Is(err, guard.ErrEviction):
		return fmt.Errorf("redis: %w (set redis.accept_eviction only for a server that can never reach its maxmemory)", err)
	case err != nil:
		gw.log.Warn("gateway: Redis not ready at start; /readyz reports it until it is", "err", err)
	}
	gw.consultSecondary(ctx)
	return nil
}

// Serve serves the proxy on ln (and the admin endpoints on admin, if not
// nil) until ctx ends, then shuts down gracefully: /readyz turns 503, no
// new connection is accepted, requests in flight get ShutdownTimeout to
// finish (a forwarded request is seen through to the upstream's answer,
// which is stored). Past it, what still runs is ended: a request not yet
// sent to the upstream releases its key and is answered 503; one that
// was sent stores the outcome-unknown answer (or releases its key, with
// unknown_outcome: resend); waiting duplicates get 503. Switched sessions
// get the same timeout, then are closed (sessions.go); Serve returns once
// they are.
func (gw *Gateway) Serve(ctx context.Context, ln, admin net.Listener) error {
	if err := gw.Prepare(ctx); err != nil {
		return err
	}
	srv := &http.Server{Handler: gw.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: gw.errorLog}
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if admin != nil {
		as := &http.Server{Handler: gw.admin, ReadHeaderTimeout: 10 * time.Second, ErrorLog: gw.errorLog}
		servers = append(servers, as)
		go func() { errc <- as.Serve(admin) }()
	}
	attrs := []any{"listen", ln.Addr().String(), "routes", len(gw.routes)}
	if admin != nil {
		attrs = append(attrs, "admin", admin.Addr().String())
	}
	gw.log.Info("gateway: serving", attrs...)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	gw.stopping.Store(true)
	gw.log.Info("gateway: shutting down", "timeout", gw.cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), gw.cfg.ShutdownTimeout)
	err := srv.Shutdown(sctx)
	// Switched sessions are no longer the Server's: they get what is left
	// of the same timeout (sessions.go).
	open := gw.sessions.wait(sctx)
	cancel()
	if err != nil || open > 0 {
		// Time is up: end what still runs; its answers are written (and
		// stored, or its keys released) within the store's write budget.
		if err != nil {
			gw.log.Warn("gateway: requests still running at the shutdown timeout; ending them")
		}
		if open > 0 {
			gw.log.Warn("gateway: switched sessions still open at the shutdown timeout; closing them", "sessions", open)
		}
		gw.stopRequests(errShuttingDown)
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err != nil {
			if err = srv.Shutdown(sctx); err != nil {
				_ = srv.Close()
			}
		}
		if n := gw.sessions.wait(sctx); n > 0 {
			gw.log.Error("gateway: switched sessions did not end once closed", "sessions", n)
		}
		cancel()
	}
	for _, s := range servers[1:] {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.Shutdown(sctx)
		cancel()
	}
	gw.log.Info("gateway: stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return serveErr
	}
	return nil
}

// Run listens where the configuration says and serves until ctx ends.
// ready, if not nil, is called with the proxy's address once it listens.
func (gw *Gateway) Run(ctx context.Context, ready func(addr string)) error {
	ln, err := net.Listen("tcp", gw.cfg.Listen)
	if err != nil {
		return err
	}
	var admin net.Listener
	if gw.cfg.AdminListen != "" {
		if admin, err = net.Listen("tcp", gw.cfg.AdminListen); err != nil {
			_ = ln.Close()
			return err
		}
	}
	if ready != nil {
		ready(ln.Addr().String())
	}
	return gw.Serve(ctx, ln, admin)
}

// logOutcome logs how a guarded request ended when that is worth a line.
func (gw *Gateway) logOutcome(r *http.Request, rt *route, lease guard.Lease, msg string, err error) {
	attrs := []any{"route", rt.name, "key", metrics.KeyDigest(lease.Key), "attempt", lease.Attempt, "fence", lease.Fence}
	if gw.cfg.Log.Keys {
		attrs = append(attrs, "scope", lease.Key.Scope, "id", lease.Key.ID)
	}
	if err != nil {
		s := err.Error()
		if !gw.cfg.Log.Keys {
			// As the guard's log lines (metrics.Logger) hide it: the
			// key's "scope/id" form, which guard errors use, whatever the
			// id's length, then the id alone.
			s = metrics.Redact(s, lease.Key)
		}
		attrs = append(attrs, "err", s)
	}
	level := slog.LevelWarn
	if strings.HasPrefix(msg, "not forwarded") {
		level = slog.LevelInfo
	}
	gw.log.Log(r.Context(), level, "gateway: "+msg, attrs...)
}
