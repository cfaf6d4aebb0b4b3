package chiwalk_test

import (
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// TestSharedSubrouter: one subrouter mounted by two routers (a public and
// an internal listener), behind a guard in one only. Its catch-all is
// guarded for POST through the first and not through the second: the
// first's guard must not settle the second's catch-all.
func TestSharedSubrouter(t *testing.T) {
	idem := singleCallerGuard()
	api := chi.NewRouter()
	api.HandleFunc("/orders", ok)
	public := chi.NewRouter()
	public.With(idem).Mount("/api", api)
	internal := chi.NewRouter()
	internal.Mount("/api", api)
	rec := httptest.NewRecorder()
	internal.ServeHTTP(rec, httptest.NewRequest("POST", "/api/orders", nil))
	if rec.Code != 201 {
		t.Fatalf("internal POST without a key: %d", rec.Code)
	}
	inv := inventory.New(inventory.Options{})
	addAll(t, inv, public, internal)
	invtest.SameRows(t, inv, []string{
		"http | /api/orders | POST | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /api/orders | PATCH | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /api/orders | * | none |  |  |  |  | chi | other methods",
		"http | /api/orders | * | none |  |  |  |  | chi | GAP | every method, unguarded: PATCH, POST",
	})
}
