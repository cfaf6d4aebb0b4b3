package inventory_test

// The README's inventory snippet, verbatim (TestSnippetsInTests in internal/testenv checks
// that it still is).

import (
	"context"
	"net/http"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/chiwalk"
	"github.com/idemguard/idemguard/inventory/muxwalk"
	"github.com/idemguard/idemguard/memstore"
)

func readmeInventory(g *guard.Guard, opts httpx.Options, createOrder http.Handler, ship consumerx.Handler,
	chiRouter chi.Router, muxRouter *mux.Router) error {
	inv := inventory.New(inventory.Options{})
	mux := inventory.NewServeMux(inv, nil) // http.ServeMux cannot list its routes: register through this

	// Middleware outermost first: authenticate, then the guard.
	mux.Handle("POST /orders", createOrder, authenticate, httpx.Guard(g, opts))
	// The inventory in Markdown, or JSON with ?format=json.
	mux.Handle("GET /debug/idempotency", inv.Handler())

	// Consumers list themselves when made (adapters too: their Options.Process).
	shipOnce, err := consumerx.Wrap(g, "shipping", ship, consumerx.Options{Inventory: inv})
	if err != nil {
		return err
	}
	if err := chiwalk.Add(inv, chiRouter); err != nil { // inventory/chiwalk: r.Use, r.With, r.Group, r.Route, Mount
		return err
	}
	if err := muxwalk.Add(inv, muxRouter); err != nil { // inventory/muxwalk: guards on handlers and added with Router.Use
		return err
	}
	_ = shipOnce
	return nil
}

// TestReadmeInventory runs the snippet: every call in it succeeds.
func TestReadmeInventory(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	opts := httpx.Options{Tenant: httpx.TenantFromContext[string](accountKey{}, nil)}
	ship := func(ctx context.Context, msg consumerx.Message) error { return nil }
	if err := readmeInventory(g, opts, ok, ship, chi.NewRouter(), mux.NewRouter()); err != nil {
		t.Fatal(err)
	}
}
