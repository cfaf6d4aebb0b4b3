// Package breakerenv checks, for the tests of store wrappers (otelx,
// promx, backstop.Wrap), that the adapters see a fallback.Store's open
// breaker through the wrapper: a 503's Retry-After asks for no retry
// before the breaker's first probe.
package breakerenv

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// openTimeout is how long the breaker stays open before its first probe.
const openTimeout = 5 * time.Second

// RetryAfterUntilProbe guards a handler with httpx.Guard over wrap(fb),
// fb a fail-closed fallback.Store over a Redis of its own, kills that
// Redis so that the first request opens the breaker (open for 5 s), and
// checks that the next request's 503 has a Retry-After of at least the
// time left until the breaker's first probe (and at most 5 s), not
// UnavailableRetryAfter's 1 s: a client that followed 1 s would meet the
// same open breaker again and again.
func RetryAfterUntilProbe(t *testing.T, wrap func(fb *fallback.Store) guard.Store) {
	t.Helper()
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	fb, err := fallback.New(guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: testenv.Prefix(t)}),
		fallback.Options{Timeout: 300 * time.Millisecond, FailuresToOpen: 1, OpenTimeout: openTimeout, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := wrap(fb)
	h := httpx.Guard(guard.New(s, guard.Options{}), httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)})(
		http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }))
	srv.Kill()
	opening := time.Now() // the breaker opens after this
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
	left := time.Until(opening.Add(openTimeout)) // at least this long until a probe
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusServiceUnavailable || err != nil {
		t.Fatalf("breaker open: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if time.Duration(ra)*time.Second < left || ra > int(openTimeout/time.Second) {
		t.Errorf("breaker open under %T: Retry-After %d; the breaker lets no probe through for %v more: want %d to %d",
			s, ra, left.Round(time.Millisecond), int((left+time.Second-1)/time.Second), int(openTimeout/time.Second))
	}
}
