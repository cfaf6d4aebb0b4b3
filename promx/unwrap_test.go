package promx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/promx"
)

// TestTimedFallbackRetryAfterUntilProbe: Metrics.Store over a fail-closed
// fallback.Store whose breaker is open keeps httpx's 503 Retry-After at
// the breaker's probe time, as it is for the fallback.Store itself and
// through otelx's traced store. (The timed store named nothing it wraps,
// so the breaker was invisible and clients were told 1 s while it refused
// everything for 5 s.)
func TestTimedFallbackRetryAfterUntilProbe(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	fb, err := fallback.New(guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: testenv.Prefix(t)}),
		fallback.Options{Timeout: 300 * time.Millisecond, FailuresToOpen: 1, OpenTimeout: 5 * time.Second, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := promx.New(prometheus.NewRegistry(), promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := httpx.Guard(guard.New(m.Store(fb), guard.Options{}), httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)})(
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	srv.Kill()
	opening := time.Now()
	post := func(key string) *http.Response {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"order":"`+key+`"}`))
		r.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(w, r)
		_, _ = io.Copy(io.Discard, w.Result().Body)
		return w.Result()
	}
	_ = post("k1")
	if st := fb.State(); st != fallback.StateOpen {
		t.Fatalf("breaker %v after a failure, want open", st)
	}
	resp := post("k2")
	left := time.Until(opening.Add(5 * time.Second))
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusServiceUnavailable || err != nil {
		t.Fatalf("breaker open: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if time.Duration(ra)*time.Second < left || ra > 5 {
		t.Errorf("breaker open under promx's timed store: Retry-After %d; the breaker lets no probe through for %v more (the timed store hides fallback.Store's ProbeAt: no Unwrap)",
			ra, left.Round(time.Millisecond))
	}
	// SameStore: two timed views of one store are one store for nested guards
	// (as otelx's traced stores are).
	if _, ok := m.Store(fb).(interface{ Unwrap() guard.Store }); !ok {
		t.Errorf("promx's timed store has no Unwrap() guard.Store: internal/adapter (SameStore, UnavailableDelay) cannot see through it")
	}
}
