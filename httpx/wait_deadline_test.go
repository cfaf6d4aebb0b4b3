package httpx_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestWaitUnderRequestDeadline: a duplicate that waits (Options.Wait)
// for the key's first request, inside a server whose middleware puts a
// deadline on the request context (a common per-request timeout), must get
// an answer that says it was not done (409/503/504), never an empty 200:
// the client is still connected, and a 200 reads as success although the
// duplicate ran nothing and the first request may yet fail and release.
//
// (Found by review.)
func TestWaitUnderRequestDeadline(t *testing.T) {
	e := newEnv(t, guard.Options{})
	started := make(chan struct{})
	unblock := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-unblock
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("created"))
	})
	g := guarded(e, h, httpx.Options{Wait: 10 * time.Second})
	// Outer middleware: a per-request timeout on the context.
	timeout := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 300*time.Millisecond)
		defer cancel()
		g.ServeHTTP(w, r.WithContext(ctx))
	})
	srv, c := serve(t, timeout)

	firstDone := make(chan reply, 1)
	go func() {
		// The first request's handler outlives its context's deadline
		// only because the test blocks it; its answer is not the point.
		r, _ := send(context.Background(), c, "POST", srv.URL+"/orders", "a", key("wait-deadline")...)
		firstDone <- r
	}()
	<-started
	dup := do(t, c, "POST", srv.URL+"/orders", "a", key("wait-deadline")...)
	close(unblock)
	<-firstDone
	if dup.status != http.StatusConflict || dup.header.Get("Retry-After") == "" {
		t.Fatalf("duplicate waiting past the request context's deadline: %d %q (headers %v); "+
			"want the in-flight 409 with Retry-After, not a 200 the client takes for success", dup.status, dup.body, dup.header)
	}
}
