package chiwalk_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/chiwalk"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
)

// TestMountedHandler: a handler that is not a chi router, Mounted (a
// legacy http.ServeMux, a reverse proxy), serves every method under its
// prefix. chi's Routes hides such a mount; the inventory lists it.
func TestMountedHandler(t *testing.T) {
	var served []string
	legacy := http.NewServeMux()
	legacy.HandleFunc("/refunds", func(http.ResponseWriter, *http.Request) { served = append(served, "legacy") })
	r := chi.NewRouter()
	r.Mount("/legacy", http.StripPrefix("/legacy", legacy))
	r.Get("/health", ok)
	r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/legacy/refunds", nil))
	if len(served) != 1 {
		t.Fatalf("served %v", served)
	}
	inv := inventory.New(inventory.Options{})
	if err := chiwalk.Add(inv, r); err != nil {
		t.Fatal(err)
	}
	invtest.SameRows(t, inv, []string{
		"http | /health | GET | none |  |  |  |  | chi",
		"http | /legacy/* | * | none |  |  |  |  | chi | GAP | every method, unguarded: PATCH, POST",
	})
}
