package chiwalk_test

import (
	"fmt"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/chiwalk"
	"github.com/idemguard/idemguard/memstore"
)

// Walk a chi router once its routes are registered; the guards added with
// With, Use or Group are found on their routes.
func ExampleAdd() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: time.Hour}) // your Redis store
	r := chi.NewRouter()
	r.Use(authenticate)
	r.With(httpx.Guard(g, httpx.Options{Tenant: httpx.TenantFromContext[string](accountKey{}, nil)})).Post("/orders", ok)
	r.Group(func(r chi.Router) {
		r.Use(httpx.Guard(g, httpx.Options{SingleCaller: true, Key: httpx.ComputedKey()}))
		r.Post("/carts", ok)
	})
	r.Patch("/orders/{id}", ok)

	inv := inventory.New(inventory.Options{})
	if err := chiwalk.Add(inv, r); err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range inv.Entries() {
		fmt.Println(e.Method, e.Handler, e.Required, e.KeySource, e.Scope, e.Gap)
	}
	// Output:
	// POST /carts hard computed global false
	// POST /orders hard header tenant false
	// PATCH /orders/{id} none   true
}
