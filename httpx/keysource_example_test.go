package httpx_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// Clients that put the key in the JSON body: the payment's own id is its
// idempotency key. A retry replays; the same id with another amount is
// refused, as a header key would be; a body without the id gets 400.
func ExampleKeyFromBody() {
	mr, _ := miniredis.Run() // an embedded Redis; use your real one
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var payments atomic.Int64
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "payment %d for %s", payments.Add(1), r.Context().Value(accountKey{}))
	})
	idem := httpx.Guard(g, httpx.Options{
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil),
		Key:    httpx.KeyFromBody("/payment/id"),
	})
	m := http.NewServeMux()
	m.Handle("POST /payments", authenticate(idem(pay)))
	srv := httptest.NewServer(m)
	defer srv.Close()

	post(srv, "/payments", "tok-ada-1", "", `{"payment":{"id":"pay-7","amount":10}}`)
	post(srv, "/payments", "tok-ada-2", "", `{"payment":{"id":"pay-7","amount":10}}`) // a retry
	post(srv, "/payments", "tok-ada-1", "", `{"payment":{"id":"pay-7","amount":99}}`)
	post(srv, "/payments", "tok-ada-1", "", `{"payment":{"amount":10}}`)
	// Output:
	// 201 replayed=false payment 1 for ada
	// 201 replayed=true payment 1 for ada
	// 422 replayed=false https://idemguard.dev/problems/key-mismatch
	// 400 replayed=false https://idemguard.dev/problems/missing-key
}

// Clients that send no key: the key is computed from the caller, the
// route and the request. A retry of the same request replays; a different
// body is a new order. Beware: the same body sent again on purpose within
// the guard's TTL is the same order too (see ComputedKey).
func ExampleComputedKey() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var orders atomic.Int64
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d for %s", orders.Add(1), r.Context().Value(accountKey{}))
	})
	idem := httpx.Guard(g, httpx.Options{
		Tenant: httpx.TenantFromContext[string](accountKey{}, nil),
		Key:    httpx.ComputedKey(),
	})
	m := http.NewServeMux()
	m.Handle("POST /orders", authenticate(idem(create)))
	srv := httptest.NewServer(m)
	defer srv.Close()

	post(srv, "/orders", "tok-ada-1", "", `{"cart":"c-1"}`)
	post(srv, "/orders", "tok-ada-2", "", `{"cart":"c-1"}`)    // a retry, with a refreshed token
	post(srv, "/orders", "tok-ada-1", "", `{"cart":"c-2"}`)    // another order
	post(srv, "/orders", "tok-bob", "", `{"cart":"c-1"}`)      // another caller
	post(srv, "/orders", "tok-ada-1", "k-1", `{"cart":"c-1"}`) // a key the client sends wins
	// Output:
	// 201 replayed=false order 1 for ada
	// 201 replayed=true order 1 for ada
	// 201 replayed=false order 2 for ada
	// 201 replayed=false order 3 for bob
	// 201 replayed=false order 4 for ada
}
