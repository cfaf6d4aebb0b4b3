package httpx_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestRetryLaterReleases: a handler's 408, 429 or 499 says the request was
// not done and asks the client to try again (its payment provider's rate
// limit passed on with Retry-After; the client gone before the work). Like
// a 5xx, and like grpcx's DefaultRelease (ResourceExhausted, Canceled),
// it releases the key: stored, it would answer the retry it asks for,
// under the same key, for the whole TTL.
func TestRetryLaterReleases(t *testing.T) {
	for _, code := range []int{http.StatusRequestTimeout, http.StatusTooManyRequests, 499} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			var runs atomic.Int64
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					w.Header().Set("Retry-After", "1")
					w.WriteHeader(code)
					return
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, "charged")
			})
			srv, c := serve(t, guarded(e, h, httpx.Options{}))
			first := do(t, c, "POST", srv.URL+"/o", "a", key("later")...)
			if first.status != code || first.replayed() {
				t.Fatalf("first: %d replayed %v", first.status, first.replayed())
			}
			if _, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /o", ID: "later"}); !errors.Is(err, guard.ErrNotFound) {
				t.Fatalf("after the %d the key is %v; want released", code, err)
			}
			retry := do(t, c, "POST", srv.URL+"/o", "a", key("later")...)
			if retry.status != http.StatusCreated || retry.replayed() || runs.Load() != 2 {
				t.Fatalf("retry: %d replayed %v after %d runs; want the handler's 201", retry.status, retry.replayed(), runs.Load())
			}
			if again := do(t, c, "POST", srv.URL+"/o", "a", key("later")...); !again.replayed() || again.status != http.StatusCreated || runs.Load() != 2 {
				t.Fatalf("after the 201: %d replayed %v, %d runs", again.status, again.replayed(), runs.Load())
			}
		})
	}
}
