package chiwalk_test

import (
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// TestMethodOverridesGuardedCatchAll: a guarded catch-all and a POST of
// its own, unguarded, on one chi node: POST is served by its own handler,
// so the inventory lists it once, as the gap it is, and not also as
// guarded by the catch-all's guard, which never sees it. Registered the
// other way round, the catch-all takes POST back, guarded.
func TestMethodOverridesGuardedCatchAll(t *testing.T) {
	idem := singleCallerGuard()
	var served []string
	mark := marker(&served)
	r := chi.NewRouter()
	r.With(idem).HandleFunc("/orders", mark("guarded catch-all"))
	r.Post("/orders", mark("own POST"))
	r.Post("/carts", mark("own POST"))
	r.With(idem).HandleFunc("/carts", mark("guarded catch-all"))
	for _, target := range []string{"/orders", "/carts"} {
		req := httptest.NewRequest("POST", target, nil)
		req.Header.Set("Idempotency-Key", "k")
		r.ServeHTTP(httptest.NewRecorder(), req)
	}
	if len(served) != 2 || served[0] != "own POST" || served[1] != "guarded catch-all" {
		t.Fatalf("served %v", served)
	}
	inv := inventory.New(inventory.Options{})
	addAll(t, inv, r)
	invtest.SameRows(t, inv, []string{
		"http | /carts | POST | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /carts | PATCH | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /carts | * | none |  |  |  |  | chi | other methods",
		"http | /orders | POST | none |  |  |  |  | chi | GAP",
		"http | /orders | PATCH | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /orders | * | none |  |  |  |  | chi | other methods",
	})
}
