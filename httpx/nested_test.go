package httpx_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestNestedGuard: a Guard inside a Guard of the same guard.Guard (a
// router-wide guard and a route's own, or the middleware applied twice)
// runs the handler once under the outer claim and the retry replays its
// answer. The inner one used to meet the outer's claim as a request in
// flight: its 409 became the key's stored answer, for the whole TTL, and
// the handler never ran. An inner guard that keys the request otherwise
// (here by a body field) still claims its own key.
func TestNestedGuard(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("placed"))
	})
	opts := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
	idem := httpx.Guard(e.g, opts)
	srv, c := serve(t, idem(idem(h)))
	for i := range 2 {
		r := do(t, c, "POST", srv.URL+"/orders", `{"order":"o-1"}`, key("nest-1")...)
		if r.status != http.StatusCreated || string(r.body) != "placed" || r.replayed() != (i == 1) {
			t.Fatalf("request %d through two guards: %d replayed %v %q", i+1, r.status, r.replayed(), r.body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}

	// Keyed otherwise inside: two claims, two keys, one run.
	byBody := opts
	byBody.Key = httpx.KeyFromBody("/order")
	srv2, c2 := serve(t, idem(httpx.Guard(e.g, byBody)(h)))
	for i := range 2 {
		r := do(t, c2, "POST", srv2.URL+"/orders", `{"order":"o-2"}`, key("nest-2")...)
		if r.status != http.StatusCreated || r.replayed() != (i == 1) {
			t.Fatalf("request %d through a header guard and a body-key guard: %d replayed %v %q", i+1, r.status, r.replayed(), r.body)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times in all, want 2", n)
	}
}

// TestNestedGuardsOneStore: a router-wide Guard and a route's own, of two
// guard.Guard values over one store (a route that needs its own TTL needs
// a Guard of its own), key a plain route alike ("POST /charges": the
// escaped path outside the mux, the pattern inside). The inner one met the
// outer's claim as a request in flight: its 409 became the key's stored
// answer, replayed for the whole TTL, and the handler never ran. It now
// runs once under the outer claim, as under one guard.Guard.
func TestNestedGuardsOneStore(t *testing.T) {
	e := newEnv(t, guard.Options{})
	route := guard.New(e.store, guard.Options{TTL: time.Hour})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("charged"))
	})
	opts := httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)}
	mux := http.NewServeMux()
	mux.Handle("POST /charges", httpx.Guard(route, opts)(h))
	srv, c := serve(t, httpx.Guard(e.g, opts)(mux))
	for i := range 2 {
		r := do(t, c, "POST", srv.URL+"/charges", `{"amount":5}`, key("nest-3")...)
		if r.status != http.StatusCreated || string(r.body) != "charged" || r.replayed() != (i == 1) {
			t.Fatalf("request %d through a router's and a route's Guard over one store: %d replayed %v %q", i+1, r.status, r.replayed(), r.body)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
