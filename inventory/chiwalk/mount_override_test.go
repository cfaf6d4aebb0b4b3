package chiwalk_test

import (
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// TestRouteOnMountPatternListed: a method (r.Post) or every method
// (r.Handle) registered on a mount's own pattern after Mount is served by
// the router above, never by the guarded mounted one: the inventory lists
// it, unguarded, as the gap it is (it listed only the mounted router's
// routes, guarded).
func TestRouteOnMountPatternListed(t *testing.T) {
	idem := singleCallerGuard()
	var served []string
	mark := marker(&served)
	sub := func() chi.Router {
		sub := chi.NewRouter()
		sub.With(idem).Post("/orders", mark("guarded sub POST"))
		return sub
	}
	r := chi.NewRouter()
	r.Mount("/api", sub())
	r.Post("/api/*", mark("unguarded POST"))
	r.Mount("/v2", sub())
	r.Handle("/v2/*", mark("unguarded catch-all"))
	r.Mount("/v3", sub())
	for _, target := range []string{"/api/orders", "/v2/orders", "/v3/orders"} {
		req := httptest.NewRequest("POST", target, nil)
		req.Header.Set("Idempotency-Key", "k")
		r.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(served) != 3 || served[0] != "unguarded POST" || served[1] != "unguarded catch-all" || served[2] != "guarded sub POST" {
		t.Fatalf("served %v", served)
	}
	inv := inventory.New(inventory.Options{})
	addAll(t, inv, r)
	invtest.SameRows(t, inv, []string{
		"http | /api/* | POST | none |  |  |  |  | chi | GAP",
		"http | /api/orders | POST | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /v2/* | * | none |  |  |  |  | chi | GAP | every method, unguarded: PATCH, POST",
		"http | /v2/orders | POST | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /v3/orders | POST | hard | header | Idempotency-Key | global | 1h | chi",
	})
}
