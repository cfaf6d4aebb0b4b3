package chiwalk_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/chiwalk"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
	"github.com/idemguard/idemguard/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type accountKey struct{}

func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, r.Header.Get("X-Account"))))
	})
}

func ok(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) }

// singleCallerGuard is a SingleCaller httpx guard (TTL 1h) on a memstore
// of its own.
func singleCallerGuard() func(http.Handler) http.Handler {
	return httpx.Guard(guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: time.Hour}), httpx.Options{SingleCaller: true})
}

// marker makes handlers that append their name to *served.
func marker(served *[]string) func(name string) http.HandlerFunc {
	return func(name string) http.HandlerFunc {
		return func(http.ResponseWriter, *http.Request) { *served = append(*served, name) }
	}
}

// addAll walks each router into inv, failing t on an error.
func addAll(t *testing.T, inv *inventory.Inventory, routers ...chi.Routes) {
	t.Helper()
	for _, router := range routers {
		if err := chiwalk.Add(inv, router); err != nil {
			t.Fatal(err)
		}
	}
}

// TestChiApp: a chi service with guards by With, Use in a Group and a
// Route, an unguarded webhook, a mounted subrouter without a guard, a
// catch-all route, and a consumer.
func TestChiApp(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: 24 * time.Hour})
	tenant := httpx.TenantFromContext[string](accountKey{}, nil)
	inv := inventory.New(inventory.Options{})

	r := chi.NewRouter()
	r.Use(authenticate)
	r.With(httpx.Guard(g, httpx.Options{Tenant: tenant})).Post("/orders", ok)
	r.With(httpx.Guard(g, httpx.Options{Tenant: tenant, Optional: true})).Patch("/orders/{id}", ok)
	r.Get("/orders/{id}", ok)
	r.Post("/webhooks", ok)
	r.Group(func(r chi.Router) {
		r.Use(httpx.Guard(g, httpx.Options{Tenant: tenant, CallerScope: inventory.ScopeUser, Key: httpx.KeyFromBody("/payment_id")}))
		r.Post("/payments", ok)
	})
	r.Route("/v2", func(r chi.Router) {
		r.Use(httpx.Guard(g, httpx.Options{SingleCaller: true, Key: httpx.ComputedKey()}))
		r.Post("/carts", ok)
		r.Put("/carts/{id}", ok)
	})
	admin := chi.NewRouter()
	admin.Post("/refunds", ok)
	r.Mount("/admin", admin)
	r.Handle("/files/*", http.HandlerFunc(ok))
	r.With(httpx.Guard(g, httpx.Options{SingleCaller: true})).HandleFunc("/rpc", ok)
	r.HandleFunc("/mixed", ok)
	r.With(httpx.Guard(g, httpx.Options{SingleCaller: true})).Post("/mixed", ok)

	if _, err := consumerx.NewProcessor(g, "fulfilment",
		consumerx.Options{Inventory: inv, MessageType: "ORDERS.created"}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second walk lists nothing twice
		if err := chiwalk.Add(inv, r); err != nil {
			t.Fatal(err)
		}
	}
	computed := "sha256(method, route, path, query, Content-Type, body); Idempotency-Key when sent"
	invtest.SameRows(t, inv, []string{
		"http | /admin/refunds | POST | none |  |  |  |  | chi | GAP",
		"http | /files/* | * | none |  |  |  |  | chi | GAP | every method, unguarded: PATCH, POST",
		"http | /mixed | POST | hard | header | Idempotency-Key | global | 24h | chi",
		"http | /mixed | * | none |  |  |  |  | chi | GAP | other methods, unguarded: PATCH",
		"http | /orders | POST | hard | header | Idempotency-Key | tenant | 24h | chi",
		"http | /orders/{id} | GET | none |  |  |  |  | chi",
		"http | /orders/{id} | PATCH | soft | header | Idempotency-Key | tenant | 24h | chi",
		"http | /payments | POST | hard | body | /payment_id | user | 24h | chi",
		"http | /rpc | POST | hard | header | Idempotency-Key | global | 24h | chi",
		"http | /rpc | PATCH | hard | header | Idempotency-Key | global | 24h | chi",
		"http | /rpc | * | none |  |  |  |  | chi | other methods",
		"http | /v2/carts | POST | hard | computed | " + computed + " | global | 24h | chi",
		"http | /v2/carts/{id} | PUT | none |  |  |  |  | chi | the route's guard does not act on PUT",
		"http | /webhooks | POST | none |  |  |  |  | chi | GAP",
		"consumer | fulfilment | ORDERS.created | hard | message_id | message id | global | 24h | consumerx",
	})

	// With PUT unsafe, the cart's PUT is a gap too.
	strict := inventory.New(inventory.Options{UnsafeMethods: []string{"POST", "PATCH", "PUT"}})
	if err := chiwalk.Add(strict, r); err != nil {
		t.Fatal(err)
	}
	var gaps []string
	for _, e := range strict.Gaps() {
		gaps = append(gaps, e.Method+" "+e.Handler)
	}
	want := "POST /admin/refunds,* /files/*,* /mixed,* /rpc,PUT /v2/carts/{id},POST /webhooks"
	if got := join(gaps); got != want {
		t.Fatalf("gaps %s, want %s", got, want)
	}
}

func join(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}

func TestNil(t *testing.T) {
	if chiwalk.Add(nil, chi.NewRouter()) == nil || chiwalk.Add(inventory.New(inventory.Options{}), nil) == nil {
		t.Fatal("nil accepted")
	}
}

// TestGuardAboveSubrouters: a guard Used on the root router, or on a
// Group a subrouter is routed in, covers the subrouters' routes.
func TestGuardAboveSubrouters(t *testing.T) {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: time.Hour})
	r := chi.NewRouter()
	r.Use(httpx.Guard(g, httpx.Options{SingleCaller: true}))
	api := chi.NewRouter()
	api.Post("/orders", ok)
	r.Mount("/api", api)
	plain := chi.NewRouter()
	plain.Group(func(r chi.Router) {
		r.Use(httpx.Guard(g, httpx.Options{SingleCaller: true, Optional: true}))
		r.Route("/v3", func(r chi.Router) { r.Post("/quotes", ok) })
	})
	plain.Post("/open", ok)
	inv := inventory.New(inventory.Options{})
	addAll(t, inv, r, plain)
	invtest.SameRows(t, inv, []string{
		"http | /api/orders | POST | hard | header | Idempotency-Key | global | 1h | chi",
		"http | /open | POST | none |  |  |  |  | chi | GAP",
		"http | /v3/quotes | POST | soft | header | Idempotency-Key | global | 1h | chi",
	})
}
