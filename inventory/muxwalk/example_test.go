package muxwalk_test

import (
	"fmt"
	"time"

	"github.com/gorilla/mux"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/muxwalk"
	"github.com/idemguard/idemguard/memstore"
)

// Walk a gorilla/mux router once its routes are registered; a guard a
// subrouter Uses is found on each of its routes.
func ExampleAdd() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: time.Hour}) // your Redis store
	r := mux.NewRouter()
	api := r.PathPrefix("/api").Subrouter()
	api.Use(httpx.Guard(g, httpx.Options{SingleCaller: true}))
	api.Handle("/orders", ok).Methods("POST")
	r.Handle("/webhooks", ok).Methods("POST")

	inv := inventory.New(inventory.Options{})
	if err := muxwalk.Add(inv, r); err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range inv.Entries() {
		fmt.Println(e.Method, e.Handler, e.Required, e.KeySource, e.Gap)
	}
	// Output:
	// POST /api/orders hard header false
	// POST /webhooks none  true
}
