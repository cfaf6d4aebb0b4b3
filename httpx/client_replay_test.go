package httpx_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestTransportStopsAtReplay: a response the server replays
// (Idempotent-Replayed: true) is the key's stored answer, and asking again
// with the same key can only replay it again: the transport returns it
// rather than retrying it, whatever its status. A handler that answers a
// downstream's 429 (stored: a 4xx), or a 409 conflict of its own with
// Retry-After, or a 503 under Store5xx, is retried once (its first answer
// is not a replay) and the replay is returned; before, the client spent
// MaxAttempts (or MaxInFlightWait, a minute by default) on replays.
func TestTransportStopsAtReplay(t *testing.T) {
	for _, code := range []int{http.StatusConflict, http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			var runs, attempts atomic.Int64
			h := httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true, Store5xx: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(code)
				io.WriteString(w, "no")
			}))
			srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				attempts.Add(1)
				h.ServeHTTP(w, r)
			}))
			c := retryClient(t, httpx.TransportOptions{MaxAttempts: 5, InFlightDelay: 20 * time.Millisecond, MaxInFlightWait: 2 * time.Second})
			resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != code || resp.Header.Get(httpx.ReplayedHeader) != "true" {
				t.Fatalf("final %d replayed %q", resp.StatusCode, resp.Header.Get(httpx.ReplayedHeader))
			}
			if runs.Load() != 1 || attempts.Load() != 2 {
				t.Fatalf("%d attempts (%d runs); want 2: the first answer, and its replay returned", attempts.Load(), runs.Load())
			}
		})
	}
}
