package httpx_test

import (
	"bytes"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestRouters runs the same story through ServeMux with patterns, chi v5
// (route-level and router-level middleware) and gorilla/mux.
func TestRouters(t *testing.T) {
	type router struct {
		name  string
		build func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler
		scope string // the default scope the router lets the middleware see
	}
	routers := []router{
		{"ServeMux", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
			m := http.NewServeMux()
			m.Handle("POST /orders/{id}", mw(h))
			m.Handle("GET /orders/{id}", mw(h))
			return m
		}, "POST /orders/{id}"},
		{"chi With", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
			r := chi.NewRouter()
			r.With(mw).Post("/orders/{id}", h.ServeHTTP)
			r.With(mw).Get("/orders/{id}", h.ServeHTTP)
			return r
		}, "POST /orders/{id}"},
		{"chi Use", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
			r := chi.NewRouter()
			r.Use(mw)
			r.Post("/orders/{id}", h.ServeHTTP)
			r.Get("/orders/{id}", h.ServeHTTP)
			return r
		}, "POST /orders/7"},
		{"gorilla/mux", func(mw func(http.Handler) http.Handler, h http.Handler) http.Handler {
			r := mux.NewRouter()
			r.Use(mux.MiddlewareFunc(mw))
			r.Handle("/orders/{id}", h).Methods("POST", "GET")
			return r
		}, "POST /orders/7"},
	}
	for _, rt := range routers {
		t.Run(rt.name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			h := &orders{}
			srv, c := serve(t, rt.build(httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true}), h))
			url := srv.URL + "/orders/7"

			first := do(t, c, "POST", url, "a", key("r-1")...)
			second := do(t, c, "POST", url, "a", key("r-1")...)
			if first.status != http.StatusCreated || first.replayed() {
				t.Fatalf("first: %d replayed %v", first.status, first.replayed())
			}
			if !second.replayed() || second.status != first.status || !bytes.Equal(second.body, first.body) {
				t.Fatalf("second: %d replayed %v body %q", second.status, second.replayed(), second.body)
			}
			if r := do(t, c, "POST", url, "b", key("r-1")...); r.status != http.StatusUnprocessableEntity {
				t.Fatalf("other body: %d", r.status)
			}
			if r := do(t, c, "POST", url, "a"); r.status != http.StatusBadRequest {
				t.Fatalf("no key: %d", r.status)
			}
			for range 2 {
				if r := do(t, c, "GET", url, "", key("r-1")...); r.replayed() || r.status != http.StatusCreated {
					t.Fatalf("GET: %d replayed %v", r.status, r.replayed())
				}
			}
			if n := h.runs.Load(); n != 3 {
				t.Fatalf("handler ran %d times, want 3 (one POST, two GETs)", n)
			}
			if _, err := e.g.Get(t.Context(), guard.Key{Scope: rt.scope, ID: "r-1"}); err != nil {
				t.Fatalf("record under scope %q: %v", rt.scope, err)
			}
		})
	}
}

// TestPatternScope: with a pattern, two paths of one route share a key's
// scope (the second gets 422), as the default scope promises.
func TestPatternScope(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	m := http.NewServeMux()
	m.Handle("POST /orders/{id}", httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) { runs.Add(1) })))
	srv, c := serve(t, m)
	if r := do(t, c, "POST", srv.URL+"/orders/1", "a", key("s-1")...); r.status != 200 {
		t.Fatalf("first: %d", r.status)
	}
	if r := do(t, c, "POST", srv.URL+"/orders/2", "a", key("s-1")...); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other path of the route: %d, want 422", r.status)
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
}
