package muxwalk_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gorilla/mux"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
	"github.com/idemguard/idemguard/inventory/muxwalk"
	"github.com/idemguard/idemguard/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type accountKey struct{}

func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, r.Header.Get("X-Account"))))
	})
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })

func newGuard() *guard.Guard {
	return guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: 48 * time.Hour})
}

// TestGorillaApp: a gorilla/mux service with a guard wrapped around a
// handler, guards added with Use on subrouters (one two levels up), an
// unguarded webhook, a route without Methods, and a consumer.
func TestGorillaApp(t *testing.T) {
	g := newGuard()
	tenant := httpx.TenantFromContext[string](accountKey{}, nil)
	inv := inventory.New(inventory.Options{})

	r := mux.NewRouter()
	r.Use(authenticate)
	r.Handle("/orders", httpx.Guard(g, httpx.Options{Tenant: tenant})(ok)).Methods("POST")
	r.Handle("/orders/{id}", ok).Methods("GET")
	r.Handle("/webhooks", ok).Methods("POST")
	r.Handle("/any", ok)
	api := r.PathPrefix("/api").Subrouter()
	api.Use(httpx.Guard(g, httpx.Options{Tenant: tenant, Optional: true, Key: httpx.KeyFromBody("/id")}))
	api.Handle("/items", ok).Methods("POST", "PUT")
	v2 := r.PathPrefix("/v2").Subrouter()
	v2.Use(httpx.Guard(g, httpx.Options{SingleCaller: true, Key: httpx.ComputedKey("X-Client")}))
	carts := v2.PathPrefix("/carts").Subrouter()
	carts.Handle("/{id}", ok).Methods("PATCH")

	if _, err := consumerx.NewProcessor(g, "ledger",
		consumerx.Options{Inventory: inv, MessageType: "payment.settled"}); err != nil {
		t.Fatal(err)
	}
	if err := muxwalk.Add(inv, r); err != nil {
		t.Fatal(err)
	}
	invtest.SameRows(t, inv, []string{
		"http | /any | * | none |  |  |  |  | gorilla/mux | GAP | every method, unguarded: PATCH, POST",
		"http | /api/items | POST | soft | body | /id | tenant | 48h | gorilla/mux",
		"http | /api/items | PUT | none |  |  |  |  | gorilla/mux | the route's guard does not act on PUT",
		"http | /orders | POST | hard | header | Idempotency-Key | tenant | 48h | gorilla/mux",
		"http | /orders/{id} | GET | none |  |  |  |  | gorilla/mux",
		"http | /v2/carts/{id} | PATCH | hard | computed | sha256(method, route, path, query, Content-Type, X-Client, body); Idempotency-Key when sent | global | 48h | gorilla/mux",
		"http | /webhooks | POST | none |  |  |  |  | gorilla/mux | GAP",
		"consumer | ledger | payment.settled | hard | message_id | message id | global | 48h | consumerx",
	})
}

// TestRootUse: a guard on the whole router covers every route's POST and
// PATCH, as the router serves them.
func TestRootUse(t *testing.T) {
	g := newGuard()
	inv := inventory.New(inventory.Options{})
	r := mux.NewRouter()
	r.Use(mux.MiddlewareFunc(httpx.Guard(g, httpx.Options{SingleCaller: true})))
	r.Handle("/orders/{id}", ok).Methods("POST", "GET")
	if err := muxwalk.Add(inv, r); err != nil {
		t.Fatal(err)
	}
	invtest.SameRows(t, inv, []string{
		"http | /orders/{id} | GET | none |  |  |  |  | gorilla/mux",
		"http | /orders/{id} | POST | hard | header | Idempotency-Key | global | 48h | gorilla/mux",
	})
}

// TestUseMiddlewareSeen pins the gorilla/mux field Middleware reads: the
// middleware Use added, outermost first, and they are the ones served.
func TestUseMiddlewareSeen(t *testing.T) {
	var order []string
	mark := func(name string) mux.MiddlewareFunc {
		return func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				order = append(order, name)
				next.ServeHTTP(w, r)
			})
		}
	}
	r := mux.NewRouter()
	r.Use(mark("a"), mark("b"))
	mws := muxwalk.Middleware(r)
	if len(mws) != 2 {
		t.Fatalf("%d middleware read from the router, want 2: has gorilla/mux moved Router.middlewares?", len(mws))
	}
	h := mws[0](mws[1](ok))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	if len(order) != 2 || order[0] != "a" || order[1] != "b" {
		t.Fatalf("served %v, want [a b]", order)
	}
	if muxwalk.Middleware(mux.NewRouter()) != nil || muxwalk.Middleware(nil) != nil {
		t.Fatal("middleware of a router without any")
	}
	if muxwalk.Add(nil, r) == nil || muxwalk.Add(inventory.New(inventory.Options{}), nil) == nil {
		t.Fatal("nil accepted")
	}
}
