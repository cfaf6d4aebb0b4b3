package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// healthz answers 200 while the process serves: liveness, nothing else.
func (gw *Gateway) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write([]byte("ok\n"))
}

// readiness is /readyz's answer.
type readiness struct {
	Ready  bool              `json:"ready"`
	Checks map[string]string `json:"checks"`
}

// readyz answers 200 when the gateway can guard requests: it is not
// shutting down, Redis answers (every master of a Cluster), the scripts
// are in its script cache (loaded again if a restart lost them), and its
// eviction policy is noeviction (or accepted by redis.accept_eviction).
// Otherwise 503; the body says which check failed.
func (gw *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	res := gw.checkReady(ctx)
	body, _ := json.Marshal(res)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !res.Ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(append(body, '\n'))
}

func (gw *Gateway) checkReady(ctx context.Context) readiness {
	res := readiness{Ready: true, Checks: map[string]string{}}
	fail := func(name, msg string) {
		res.Ready = false
		res.Checks[name] = msg
	}
	if gw.stopping.Load() {
		fail("serving", "shutting down")
	} else {
		res.Checks["serving"] = "ok"
	}
	if gw.rstore == nil {
		res.Checks["store"] = fmt.Sprintf("%T (not Redis): not checked", gw.store)
		return res
	}
	if err := gw.ping(ctx); err != nil {
		if gw.secondary != nil && gw.db != nil {
			// Policy secondary: claims go to PostgreSQL while Redis is out.
			// Its own time: a Redis that hangs spent the probe's (go-redis
			// reads until its ReadTimeout, whatever ctx says).
			pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			perr := gw.db.PingContext(pctx)
			pcancel()
			if perr == nil {
				res.Checks["redis"] = "unreachable (keys kept in the fallback PostgreSQL): " + err.Error()
				res.Checks["secondary"] = "ok"
				return res
			}
			fail("secondary", "unreachable: "+perr.Error())
		}
		fail("redis", "unreachable: "+err.Error())
		return res
	}
	res.Checks["redis"] = "ok"
	if gw.fb != nil && gw.db != nil && time.Now().Before(gw.fb.ConsultUntil()) {
		// Every claim Redis grants is refused while PostgreSQL cannot be
		// read to check it.
		if err := gw.db.PingContext(ctx); err != nil {
			fail("secondary", "unreachable, and Redis's claims are checked against it: "+err.Error())
		} else {
			res.Checks["secondary"] = "ok"
		}
	}
	switch loaded, err := gw.scriptsLoaded(ctx); {
	case err != nil:
		fail("scripts", err.Error())
	case loaded:
		res.Checks["scripts"] = "ok"
	default:
		if err := gw.rstore.LoadScripts(ctx); err != nil {
			fail("scripts", "missing from the script cache and could not be loaded: "+err.Error())
		} else {
			res.Checks["scripts"] = "ok (loaded again: the server had lost them)"
		}
	}
	// An accepted policy's warning goes out when it is first found (at
	// start, or later: Redis unreachable at start, or reconfigured) and
	// when the servers or their policies change, not on every probe.
	err := gw.checkEviction(ctx)
	switch {
	case errors.Is(err, guard.ErrEviction):
		fail("eviction", err.Error())
	case err != nil:
		fail("eviction", "cannot read the eviction policy: "+err.Error())
	case gw.cfg.Redis.AcceptEviction:
		res.Checks["eviction"] = "ok (eviction accepted by redis.accept_eviction)"
	default:
		res.Checks["eviction"] = "ok (noeviction)"
	}
	if gw.fb != nil {
		res.Checks["fallback"] = gw.cfg.Fallback.Policy + ", breaker " + gw.fb.State().String()
	}
	return res
}

// ping reaches Redis: every master of a Cluster.
func (gw *Gateway) ping(ctx context.Context) error {
	if cc, ok := gw.redis.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	}
	return gw.redis.Ping(ctx).Err()
}

// scriptsLoaded reports whether every script is in the script cache (of
// every master of a Cluster).
func (gw *Gateway) scriptsLoaded(ctx context.Context) (bool, error) {
	var hashes []string
	for _, s := range gw.rstore.Scripts() {
		hashes = append(hashes, s.Hash())
	}
	var missing atomic.Bool // ForEachMaster checks the masters at once
	check := func(ctx context.Context, c redis.Scripter) error {
		found, err := c.ScriptExists(ctx, hashes...).Result()
		if err != nil {
			return err
		}
		for _, f := range found {
			if !f {
				missing.Store(true)
			}
		}
		return nil
	}
	var err error
	if cc, ok := gw.redis.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return check(ctx, c) })
	} else {
		err = check(ctx, gw.redis)
	}
	return !missing.Load(), err
}

// Results of a guarded request, the "result" label of
// idemguard_gateway_requests_total.
const (
	resultForwarded      = "forwarded"       // the upstream answered; the answer is the key's result
	resultNotForwarded   = "not_forwarded"   // nothing was sent; key released
	resultUnknown        = "outcome_unknown" // sent, no complete answer; outcome-unknown stored
	resultResend         = "resend"          // sent, no complete answer; key released for a resend
	resultUpstreamBusy   = "upstream_busy"   // resend: the upstream answered its run in progress; passed on, key released
	resultEarlierForward = "earlier_forward" // a recovered key an earlier attempt had sent; outcome-unknown stored
	resultPassthrough    = "passthrough"     // not guarded (method, or soft route without a key)
)

// gatewayMetrics are the gateway's own series, besides the guard's
// (idemguard_outcomes_total counts replays, conflicts, recoveries).
type gatewayMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newGatewayMetrics(reg prometheus.Registerer) *gatewayMetrics {
	m := &gatewayMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemguard", Subsystem: "gateway",
			Name: "requests_total",
			Help: "Requests the gateway's routes handed to the upstream, by route and result: forwarded, not_forwarded, " +
				"outcome_unknown, resend, upstream_busy, earlier_forward, passthrough. Replays never reach the upstream: see idemguard_outcomes_total{kind=\"replayed\"}."},
			[]string{"route", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "idemguard", Subsystem: "gateway",
			Name: "upstream_duration_seconds", Help: "Time from forwarding a guarded request to the upstream's answer (or failure), by route.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"route"}),
	}
	reg.MustRegister(m.requests, m.latency)
	return m
}

func (m *gatewayMetrics) request(route, result string) {
	m.requests.WithLabelValues(route, result).Inc()
}

func (m *gatewayMetrics) upstream(route string, d time.Duration) {
	m.latency.WithLabelValues(route).Observe(d.Seconds())
}

// checkEviction runs the store's Check of the servers' eviction policies
// (at start and on every /readyz), its warning through evictLog. A check
// that read every policy and warned of none (noeviction everywhere)
// forgets the last warning, so that a policy warned of, changed and then
// back is warned of again.
func (gw *Gateway) checkEviction(ctx context.Context) error {
	var warned atomic.Bool
	log := slog.New(&noticing{next: gw.evictLog.Handler(), seen: &warned})
	err := gw.rstore.Check(ctx, guard.CheckOptions{AcceptEviction: gw.cfg.Redis.AcceptEviction, Logger: log})
	if err == nil && !warned.Load() {
		gw.evictLast.forget()
	}
	return err
}

// warnOnChange is a slog.Handler that passes a record on only when it
// differs (message and attributes) from the last one it passed: the
// eviction warning, checked on every /readyz, is logged once for each
// state of the servers' policies.
type warnOnChange struct {
	next slog.Handler
	last *lastRecord // shared by the handlers WithAttrs and WithGroup make
}

type lastRecord struct {
	mu  sync.Mutex
	key string
}

// forget makes the next record pass, whatever it is.
func (l *lastRecord) forget() {
	l.mu.Lock()
	l.key = ""
	l.mu.Unlock()
}

func (h *warnOnChange) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *warnOnChange) Handle(ctx context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString("\x00" + a.String())
		return true
	})
	h.last.mu.Lock()
	same := h.last.key == b.String()
	h.last.key = b.String()
	h.last.mu.Unlock()
	if same {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *warnOnChange) WithAttrs(as []slog.Attr) slog.Handler {
	return &warnOnChange{next: h.next.WithAttrs(as), last: h.last}
}

func (h *warnOnChange) WithGroup(name string) slog.Handler {
	return &warnOnChange{next: h.next.WithGroup(name), last: h.last}
}

// noticing is a slog.Handler that notes in seen that a record came (passed
// on or not), for one eviction check (checkEviction).
type noticing struct {
	next slog.Handler
	seen *atomic.Bool
}

func (h *noticing) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

func (h *noticing) Handle(ctx context.Context, r slog.Record) error {
	h.seen.Store(true)
	return h.next.Handle(ctx, r)
}

func (h *noticing) WithAttrs(as []slog.Attr) slog.Handler {
	return &noticing{next: h.next.WithAttrs(as), seen: h.seen}
}

func (h *noticing) WithGroup(name string) slog.Handler {
	return &noticing{next: h.next.WithGroup(name), seen: h.seen}
}
