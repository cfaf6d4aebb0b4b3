package muxwalk_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gorilla/mux"

	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
	"github.com/idemguard/idemguard/inventory/muxwalk"
)

// TestCatchAllFirstIsAGap: gorilla/mux serves a request with the first
// route that matches, so a route without Methods registered before a
// guarded POST route of the same path takes every POST: the inventory must
// list that POST as a gap, not as covered by the later, guarded route. A
// route with other matchers (Headers) covers only some requests, so it
// cannot settle a catch-all either, whichever comes first.
func TestCatchAllFirstIsAGap(t *testing.T) {
	idem := httpx.Guard(newGuard(), httpx.Options{SingleCaller: true})
	var served []string
	mark := func(name string) http.Handler {
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served = append(served, name) })
	}
	r := mux.NewRouter()
	r.Handle("/orders", mark("catch-all"))                     // first: takes every method
	r.Handle("/orders", idem(mark("guarded"))).Methods("POST") // never reached
	r.Handle("/refunds", idem(mark("guarded"))).Methods("POST").Headers("X-Version", "2")
	r.Handle("/refunds", mark("catch-all"))
	for _, target := range []string{"/orders", "/refunds"} {
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", target, nil))
	}
	if len(served) != 2 || served[0] != "catch-all" || served[1] != "catch-all" {
		t.Fatalf("served %v: gorilla/mux no longer matches in order", served)
	}
	inv := inventory.New(inventory.Options{})
	for range 2 { // a second walk lists nothing twice
		if err := muxwalk.Add(inv, r); err != nil {
			t.Fatal(err)
		}
	}
	invtest.SameRows(t, inv, []string{
		"http | /orders | POST | hard | header | Idempotency-Key | global | 48h | gorilla/mux",
		"http | /orders | * | none |  |  |  |  | gorilla/mux | GAP | every method, unguarded: PATCH, POST",
		"http | /refunds | POST | hard | header | Idempotency-Key | global | 48h | gorilla/mux",
		"http | /refunds | * | none |  |  |  |  | gorilla/mux | GAP | every method, unguarded: PATCH, POST",
	})
}

// TestSharedRouter: one router served by two (a public and an internal
// listener), behind a guard Used in one only: its route without Methods
// is guarded for POST through the first, not through the second.
func TestSharedRouter(t *testing.T) {
	api := mux.NewRouter()
	api.Handle("/api/orders", ok)
	public := mux.NewRouter()
	public.Use(mux.MiddlewareFunc(httpx.Guard(newGuard(), httpx.Options{SingleCaller: true})))
	public.PathPrefix("/api").Handler(api)
	internal := mux.NewRouter()
	internal.PathPrefix("/api").Handler(api)
	rec := httptest.NewRecorder()
	internal.ServeHTTP(rec, httptest.NewRequest("POST", "/api/orders", nil))
	if rec.Code != http.StatusCreated {
		t.Fatalf("internal POST without a key: %d", rec.Code)
	}
	inv := inventory.New(inventory.Options{})
	for _, r := range []*mux.Router{public, internal} {
		if err := muxwalk.Add(inv, r); err != nil {
			t.Fatal(err)
		}
	}
	invtest.SameRows(t, inv, []string{
		"http | /api/orders | POST | hard | header | Idempotency-Key | global | 48h | gorilla/mux",
		"http | /api/orders | PATCH | hard | header | Idempotency-Key | global | 48h | gorilla/mux",
		"http | /api/orders | * | none |  |  |  |  | gorilla/mux | other methods",
		"http | /api/orders | * | none |  |  |  |  | gorilla/mux | GAP | every method, unguarded: PATCH, POST",
	})
}
