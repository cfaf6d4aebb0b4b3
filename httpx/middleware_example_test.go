package httpx_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// An order endpoint on the standard ServeMux: the second POST with the same
// key gets the first one's response, and the handler runs once.
func ExampleGuard() {
	mr, _ := miniredis.Run() // an embedded Redis; use your real one
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var orders atomic.Int64
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d for %s", orders.Add(1), r.PathValue("customer"))
	})
	m := http.NewServeMux()
	m.Handle("POST /customers/{customer}/orders", httpx.Guard(g, httpx.Options{})(create))
	srv := httptest.NewServer(m)
	defer srv.Close()

	for range 2 {
		post(srv, "/customers/ada/orders", "key-1", `{"sku":"tea"}`)
	}
	post(srv, "/customers/ada/orders", "key-1", `{"sku":"coffee"}`)
	post(srv, "/customers/ada/orders", "", `{"sku":"tea"}`)
	// Output:
	// 201 replayed=false order 1 for ada
	// 201 replayed=true order 1 for ada
	// 422 replayed=false https://idemguard.dev/problems/key-mismatch
	// 400 replayed=false https://idemguard.dev/problems/missing-key
}

// With chi, as route middleware (the scope is then the route pattern) or
// for a whole router with r.Use (the scope is then the path).
func ExampleGuard_chi() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var payments atomic.Int64
	r := chi.NewRouter()
	r.With(httpx.Guard(g, httpx.Options{
		// Keys are per account: one account's key never meets another's.
		Tenant: func(r *http.Request) string { return r.Header.Get("X-Account") },
	})).Post("/payments", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "payment %d", payments.Add(1))
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	post(srv, "/payments", "pay-7", "10 EUR")
	post(srv, "/payments", "pay-7", "10 EUR")
	// Output:
	// 200 replayed=false payment 1
	// 200 replayed=true payment 1
}

// With gorilla/mux, through Router.Use.
func ExampleGuard_gorillaMux() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var refunds atomic.Int64
	r := mux.NewRouter()
	r.Use(httpx.Guard(g, httpx.Options{}))
	r.HandleFunc("/refunds/{id}", func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "refund %s #%d", mux.Vars(req)["id"], refunds.Add(1))
	}).Methods("POST", "GET")
	srv := httptest.NewServer(r)
	defer srv.Close()

	post(srv, "/refunds/r1", "ref-1", "")
	post(srv, "/refunds/r1", "ref-1", "")
	resp, _ := srv.Client().Get(srv.URL + "/refunds/r1") // GET is not guarded
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// 202 replayed=false refund r1 #1
	// 202 replayed=true refund r1 #1
	// 202 refund r1 #2
}

// post sends a POST with an idempotency key (none if key is empty) and
// prints the status, whether it was replayed, and the body (or, for a
// problem, its type).
func post(srv *httptest.Server, path, key, body string) {
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := string(b)
	if resp.Header.Get("Content-Type") == httpx.ProblemContentType {
		out = out[strings.Index(out, `"type":"`)+8:]
		out = out[:strings.IndexByte(out, '"')]
	}
	fmt.Printf("%d replayed=%v %s\n", resp.StatusCode, resp.Header.Get(httpx.ReplayedHeader) == "true", out)
}

func ExampleParseKey() {
	for _, v := range []string{`9f1c-77`, `"a \"quoted\" key"`, `two, keys`} {
		k, err := httpx.ParseKey(v)
		fmt.Printf("%q %v\n", k, err)
	}
	// Output:
	// "9f1c-77" <nil>
	// "a \"quoted\" key" <nil>
	// "" httpx: malformed idempotency key: byte 0x2c at 3 is not allowed in a bare key
}
