package chiwalk_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/chiwalk"
)

// TestMountedInlineRouterServesItsTreeUnguarded: a router made by With (an inline chi
// mux) and mounted serves only the routes registered through it behind
// its middleware: chi bakes an inline mux's middleware into the handlers
// it registers, and an inline mux's ServeHTTP runs the shared tree
// without them. The walk took r.Middlewares() of the inline mux as
// applying to every route of the tree, so a route registered on the
// underlying router, unguarded, is listed as guarded (hard) while two
// POSTs with one key both run it.
func TestMountedInlineRouterServesItsTreeUnguarded(t *testing.T) {
	idem := singleCallerGuard()
	var served []string
	mark := marker(&served)

	sub := chi.NewRouter()
	sub.Post("/pay", mark("pay"))           // registered on sub: no guard
	guarded := sub.With(idem)               // inline mux over sub's tree
	guarded.Post("/refund", mark("refund")) // registered through it: guarded
	r := chi.NewRouter()
	r.Mount("/api", guarded)

	for _, target := range []string{"/api/pay", "/api/pay", "/api/refund", "/api/refund"} {
		req := httptest.NewRequest("POST", target, nil)
		req.Header.Set("Idempotency-Key", "same-key-"+target)
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, req)
	}
	pays, refunds := 0, 0
	for _, s := range served {
		switch s {
		case "pay":
			pays++
		case "refund":
			refunds++
		}
	}
	if refunds != 1 {
		t.Fatalf("setup: refund ran %d times, want 1 (guarded)", refunds)
	}
	inv := inventory.New(inventory.Options{})
	addAll(t, inv, r)
	for _, e := range inv.Entries() {
		if e.Handler == "/api/pay" && e.Method == "POST" && !e.Gap && pays > 1 {
			t.Fatalf("POST /api/pay listed %s (gap=%v), yet two POSTs with one Idempotency-Key ran it %d times: a false guarantee", e.Required, e.Gap, pays)
		}
	}
}

// TestMountedInEachOther: chi serves two routers mounted in each other
// (a path ends after as many hops as it has); the walk through them had
// no end and overflowed the stack, a crash no recover catches. Add
// answers an error, for the routers themselves and for a router made from
// one by With (which shares its tree).
func TestMountedInEachOther(t *testing.T) {
	for _, viaWith := range []bool{false, true} {
		a, b := chi.NewRouter(), chi.NewRouter()
		a.Post("/x", ok)
		b.Post("/y", ok)
		a.Mount("/b", b)
		if viaWith {
			g := a.With(singleCallerGuard())
			g.Post("/z", ok)
			b.Mount("/a", g)
		} else {
			b.Mount("/a", a)
		}
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, httptest.NewRequest("POST", "/b/a/b/y", nil))
		if rec.Code != 201 {
			t.Fatalf("setup: chi served POST /b/a/b/y with %d", rec.Code)
		}
		err := chiwalk.Add(inventory.New(inventory.Options{}), a)
		if err == nil || !strings.Contains(err.Error(), "/b/a") {
			t.Errorf("Add of routers mounted in each other (through With: %v) = %v, want an error naming the mount", viaWith, err)
		}
	}
}
