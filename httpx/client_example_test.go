package httpx_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// A client whose POSTs survive a server that sheds the first attempt: the
// retry carries the same key, so the order is made once.
func ExampleNewClient() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var attempts, orders atomic.Int64
	var mu sync.Mutex
	keys := map[string]bool{}
	// An internal service with one client: keys need no caller scope.
	orderHandler := httpx.Guard(g, httpx.Options{SingleCaller: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", orders.Add(1))
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys[r.Header.Get("Idempotency-Key")] = true
		mu.Unlock()
		if attempts.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		orderHandler.ServeHTTP(w, r)
	}))
	defer srv.Close()

	client := httpx.NewClient(httpx.TransportOptions{Base: srv.Client().Transport})
	resp, err := client.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{"sku":"tea"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", attempts.Load(), "distinct keys:", len(keys), "orders:", orders.Load())
	// Output:
	// 201 order 1
	// attempts: 2 distinct keys: 1 orders: 1
}

// A Transport under an existing client, with its own limits.
func ExampleNewTransport() {
	var attempts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if attempts.Add(1) < 3 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "accepted")
	}))
	defer srv.Close()

	client := &http.Client{Transport: httpx.NewTransport(httpx.TransportOptions{
		Base:        srv.Client().Transport,
		MaxAttempts: 3,
	})}
	req, _ := http.NewRequest(http.MethodPatch, srv.URL+"/accounts/1", strings.NewReader(`{"limit":5}`))
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body), "after", attempts.Load(), "attempts")
	// Output:
	// 200 accepted after 3 attempts
}
