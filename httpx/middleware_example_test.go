package httpx_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// accountKey is where the example's authentication middleware stores the
// account a request comes from.
type accountKey struct{}

// authenticate stands in for your authentication middleware: it maps a
// bearer token to the account that owns it and stores the account in the
// request context. Tokens rotate; the account does not.
func authenticate(next http.Handler) http.Handler {
	accounts := map[string]string{"tok-ada-1": "ada", "tok-ada-2": "ada", "tok-bob": "bob"}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, ok := accounts[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

// An order endpoint on the standard ServeMux, behind an authentication
// middleware: keys are kept per account (TenantFromContext). A repeat with
// the same key and body gets the first response, even with a refreshed
// token; another account's request with the same key is its own.
func ExampleGuard() {
	mr, _ := miniredis.Run() // an embedded Redis; use your real one
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var orders atomic.Int64
	create := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d for %s", orders.Add(1), r.Context().Value(accountKey{}))
	})
	idem := httpx.Guard(g, httpx.Options{Tenant: httpx.TenantFromContext[string](accountKey{}, nil)})
	m := http.NewServeMux()
	m.Handle("POST /orders", authenticate(idem(create)))
	srv := httptest.NewServer(m)
	defer srv.Close()

	post(srv, "/orders", "tok-ada-1", "key-1", `{"sku":"tea"}`)
	post(srv, "/orders", "tok-ada-2", "key-1", `{"sku":"tea"}`) // the token was refreshed: same caller
	post(srv, "/orders", "tok-bob", "key-1", `{"sku":"tea"}`)   // another caller, the same key
	post(srv, "/orders", "tok-ada-1", "key-1", `{"sku":"coffee"}`)
	post(srv, "/orders", "tok-ada-1", "", `{"sku":"tea"}`)
	// Output:
	// 201 replayed=false order 1 for ada
	// 201 replayed=true order 1 for ada
	// 201 replayed=false order 2 for bob
	// 422 replayed=false https://idemguard.dev/problems/key-mismatch
	// 400 replayed=false https://idemguard.dev/problems/missing-key
}

// claimsKey is where the example's JWT middleware stores verified claims.
type claimsKey struct{}

// verifyJWT stands in for a JWT middleware (go-chi/jwtauth,
// golang-jwt/jwt, ...): it verifies the token and stores its claims. Here
// the "tokens" are looked up instead of verified.
func verifyJWT(next http.Handler) http.Handler {
	claims := map[string]map[string]any{
		"jwt-1": {"iss": "https://auth.example", "sub": "user-7"},
		"jwt-2": {"iss": "https://auth.example", "sub": "user-7"}, // a refreshed token
		"jwt-3": {"iss": "https://auth.example", "sub": "user-8"},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := claims[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), claimsKey{}, c)))
	})
}

// With chi, as route middleware (the scope is then the route pattern),
// keys kept per JWT subject (TenantFromJWT reads the verified claims; it
// never parses the token).
func ExampleGuard_chi() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var payments atomic.Int64
	r := chi.NewRouter()
	r.Use(verifyJWT)
	r.With(httpx.Guard(g, httpx.Options{Tenant: httpx.TenantFromJWT(claimsKey{})})).
		Post("/payments", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "payment %d", payments.Add(1))
		})
	srv := httptest.NewServer(r)
	defer srv.Close()

	post(srv, "/payments", "jwt-1", "pay-7", "10 EUR")
	post(srv, "/payments", "jwt-2", "pay-7", "10 EUR")
	post(srv, "/payments", "jwt-3", "pay-7", "10 EUR")
	// Output:
	// 200 replayed=false payment 1
	// 200 replayed=true payment 1
	// 200 replayed=false payment 2
}

// With gorilla/mux, through Router.Use, in an internal service that one
// caller owns (SingleCaller: keys are not scoped by caller).
func ExampleGuard_gorillaMux() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	var refunds atomic.Int64
	r := mux.NewRouter()
	r.Use(httpx.Guard(g, httpx.Options{SingleCaller: true}))
	r.HandleFunc("/refunds/{id}", func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, "refund %s #%d", mux.Vars(req)["id"], refunds.Add(1))
	}).Methods("POST", "GET")
	srv := httptest.NewServer(r)
	defer srv.Close()

	post(srv, "/refunds/r1", "", "ref-1", "")
	post(srv, "/refunds/r1", "", "ref-1", "")
	resp, _ := srv.Client().Get(srv.URL + "/refunds/r1") // GET is not guarded
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// 202 replayed=false refund r1 #1
	// 202 replayed=true refund r1 #1
	// 202 refund r1 #2
}

// With Wait, a duplicate sent while the first request runs waits for it
// and gets its response, instead of 409.
func ExampleGuard_wait() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	running := make(chan struct{})
	var charges atomic.Int64
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		close(running)
		time.Sleep(100 * time.Millisecond) // the charge itself
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", n)
	})
	idem := httpx.Guard(g, httpx.Options{Tenant: httpx.TenantFromContext[string](accountKey{}, nil), Wait: 2 * time.Second})
	srv := httptest.NewServer(authenticate(idem(charge)))
	defer srv.Close()

	first := make(chan string)
	go func() { first <- answer(srv, "/charges", "tok-ada-1", "ch-1", "5 EUR") }()
	<-running
	duplicate := answer(srv, "/charges", "tok-ada-1", "ch-1", "5 EUR") // sent while the first runs
	fmt.Println(<-first)
	fmt.Println(duplicate)
	// Output:
	// 201 replayed=false charge 1
	// 201 replayed=true charge 1
}

// TenantFromContext names the caller by what an authentication middleware
// stored, here a user record: its account id, not the token it logged in
// with.
func ExampleTenantFromContext() {
	type user struct{ AccountID, Token string }
	type userKey struct{}
	tenant := httpx.TenantFromContext(userKey{}, func(u *user) string { return u.AccountID })

	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r = r.WithContext(context.WithValue(r.Context(), userKey{}, &user{AccountID: "acct_42", Token: "short-lived"}))
	fmt.Printf("%q\n", tenant(r))
	fmt.Printf("%q\n", tenant(httptest.NewRequest(http.MethodPost, "/orders", nil))) // no user: 401
	// Output:
	// "acct_42"
	// ""
}

// TenantFromJWT names the caller by the issuer and subject of claims a JWT
// middleware verified.
func ExampleTenantFromJWT() {
	type claimsKey struct{}
	tenant := httpx.TenantFromJWT(claimsKey{})
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	r = r.WithContext(context.WithValue(r.Context(), claimsKey{},
		map[string]any{"iss": "https://auth.example", "sub": "user-7", "exp": 1.9e9}))
	fmt.Println(tenant(r))
	// Output:
	// "https://auth.example" "user-7"
}

// post prints answer's line.
func post(srv *httptest.Server, path, token, key, body string) {
	fmt.Println(answer(srv, path, token, key, body))
}

// answer sends a POST with a bearer token (none if empty) and an
// idempotency key (none if empty) and returns the status, whether it was
// replayed, and the body (or, for a problem, its type).
func answer(srv *httptest.Server, path, token, key, body string) string {
	req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := string(b)
	if resp.Header.Get("Content-Type") == httpx.ProblemContentType {
		out = out[strings.Index(out, `"type":"`)+8:]
		out = out[:strings.IndexByte(out, '"')]
	}
	return fmt.Sprintf("%d replayed=%v %s", resp.StatusCode, resp.Header.Get(httpx.ReplayedHeader) == "true", out)
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
