package httpx_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestDroppedConnectionNotStoredAsSuccess: a middleware after the
// Guard that sheds load by taking the connection and closing it, without
// a word (nginx's 444; what Fiber's c.Drop() does), on a request that does
// not ask to upgrade. The client gets no answer and the charge never ran.
// fiberx keeps such a key's marker with a 500 (22d264b: "after a Drop the
// retry was answered 200 for a charge that never ran"); the shared core
// kept net/http's (and Gin's, Echo's) with a 200, so every retry of the key
// was answered "200, response not kept" with Idempotent-Replayed: true,
// which httpx's own client returns at once: a success that was never
// answered, for a charge never made.
func TestDroppedConnectionNotStoredAsSuccess(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs, seen atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("charged"))
	})
	shed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) == 1 { // overloaded on the first attempt: drop it
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			_ = conn.Close()
			return
		}
		charge.ServeHTTP(w, r)
	})
	srv, _ := serve(t, guarded(e, shed, httpx.Options{}))
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if r, err := send(t.Context(), c, "POST", srv.URL+"/pay", "{}", key("dropped")...); err == nil {
		t.Fatalf("first: %d %q; want the connection dropped", r.status, r.body)
	}
	var r reply
	testenv.WaitFor(t, 10*time.Second, "the key's answer (not in progress)", func() bool {
		var err error
		r, err = send(t.Context(), c, "POST", srv.URL+"/pay", "{}", key("dropped")...)
		return err == nil && r.status != http.StatusConflict
	})
	if r.status < 500 || !strings.Contains(string(r.body), "not kept") || runs.Load() != 0 {
		t.Fatalf("retry: %d %q (replayed %q), the charge ran %d times; want the key's not-kept marker with a 5xx (no success), the charge not run",
			r.status, r.body, r.header.Get(httpx.ReplayedHeader), runs.Load())
	}
}
