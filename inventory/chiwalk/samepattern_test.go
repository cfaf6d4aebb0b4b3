package chiwalk_test

import (
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// TestSamePatternOtherNode: a catch-all on the root router and a guarded
// POST in a mounted subrouter can spell one pattern, but chi serves POST
// /api/orders from the root's node, unguarded; and two routers walked into
// one inventory each serve their own routes. A method's row settles a
// catch-all of its pattern only when both are one chi node's.
func TestSamePatternOtherNode(t *testing.T) {
	idem := singleCallerGuard()
	var served []string
	mark := marker(&served)
	r := chi.NewRouter()
	r.HandleFunc("/api/orders", mark("root catch-all"))
	api := chi.NewRouter()
	api.With(idem).Post("/orders", mark("guarded"))
	r.Mount("/api", api)

	public := chi.NewRouter() // a second listener's router, in the same inventory
	public.HandleFunc("/quotes", mark("public catch-all"))
	admin := chi.NewRouter()
	admin.With(idem).Post("/quotes", mark("guarded"))

	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/api/orders", nil))
	public.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/quotes", nil))
	if len(served) != 2 || served[0] != "root catch-all" || served[1] != "public catch-all" {
		t.Fatalf("served %v", served)
	}
	inv := inventory.New(inventory.Options{})
	for range 2 { // a second walk lists nothing twice
		addAll(t, inv, r, public, admin)
	}
	invtest.SameRows(t, inv, []string{
		"http | /api/orders | POST | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /api/orders | * | none |  |  |  |  | chi | GAP | every method, unguarded: PATCH, POST",
		"http | /quotes | POST | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /quotes | * | none |  |  |  |  | chi | GAP | every method, unguarded: PATCH, POST",
	})
}
