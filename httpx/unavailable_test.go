package httpx_test

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

// unwrapping is a store wrapper that names what it wraps, as otelx's does.
type unwrapping struct{ guard.Store }

func (u unwrapping) Unwrap() guard.Store { return u.Store }

// TestUnavailableRetryAfterUntilProbe: under a fail-closed fallback.Store
// whose breaker Redis's outage opened, a 503's Retry-After says when the
// breaker lets its first probe through (open timeout 5 s), not
// UnavailableRetryAfter's 1 s: a client that followed 1 s met the same
// open breaker four more times. Also through a wrapper that unwraps to the
// fallback store (otelx's traced store).
func TestUnavailableRetryAfterUntilProbe(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		t.Run("wrapped="+strconv.FormatBool(wrapped), func(t *testing.T) {
			srv := testenv.StartRedis(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
			t.Cleanup(func() { _ = rdb.Close() })
			fb, err := fallback.New(guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: testenv.Prefix(t)}),
				fallback.Options{Timeout: 300 * time.Millisecond, FailuresToOpen: 1, OpenTimeout: 5 * time.Second, Logger: testenv.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			var s guard.Store = fb
			if wrapped {
				s = unwrapping{fb}
			}
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
			left := time.Until(opening.Add(5 * time.Second)) // at least this long until a probe
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if resp.StatusCode != http.StatusServiceUnavailable || err != nil {
				t.Fatalf("breaker open: %d, Retry-After %q; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if time.Duration(ra)*time.Second < left || ra > 5 {
				t.Errorf("breaker open: Retry-After %d; the breaker lets no probe through for %v more: want %d to 5",
					ra, left.Round(time.Millisecond), int((left+time.Second-1)/time.Second))
			}
		})
	}
}
