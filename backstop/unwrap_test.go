package backstop_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapOverFallbackRetryAfterUntilProbe: backstop.Wrap over a
// fail-closed fallback.Store (design.md's "other order") lets httpx see
// the fallback's open breaker: the 503's Retry-After is the breaker's
// probe time, not UnavailableRetry's 1 s. (Wrap named no store it wraps,
// no Unwrap() guard.Store, so adapter.UnavailableDelay stopped at it.)
func TestWrapOverFallbackRetryAfterUntilProbe(t *testing.T) {
	b := mustBackstop(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	fb, err := fallback.New(guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: testenv.Prefix(t)}),
		fallback.Options{Timeout: 300 * time.Millisecond, FailuresToOpen: 1, OpenTimeout: 5 * time.Second, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := httpx.Guard(guard.New(backstop.Wrap(fb, b), guard.Options{}), httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)})(
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
		t.Errorf("breaker open under backstop.Wrap: Retry-After %d; the breaker lets no probe through for %v more (Wrap hides fallback.Store's ProbeAt: no Unwrap)",
			ra, left.Round(time.Millisecond))
	}
}
