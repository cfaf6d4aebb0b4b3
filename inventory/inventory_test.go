package inventory_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/redisstream"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
	"github.com/idemguard/idemguard/inventory/internal/invtest"
	"github.com/idemguard/idemguard/memstore"

	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type accountKey struct{}

// authenticate stands in for an authentication middleware.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, r.Header.Get("X-Account"))))
	})
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })

func newGuard(ttl time.Duration) *guard.Guard {
	return guard.New(memstore.New(memstore.Options{}), guard.Options{TTL: ttl})
}

// TestServeMuxApp: a ServeMux service with hard, soft, body-keyed and
// unguarded routes, a guard hidden inside a handler (a false gap, as the
// package doc says), an any-method route, and a Redis Streams consumer.
func TestServeMuxApp(t *testing.T) {
	g := newGuard(24 * time.Hour)
	tenant := httpx.TenantFromContext[string](accountKey{}, nil)
	hard := httpx.Guard(g, httpx.Options{Tenant: tenant})
	soft := httpx.Guard(g, httpx.Options{Tenant: tenant, CallerScope: inventory.ScopeUser, Optional: true})
	body := httpx.Guard(g, httpx.Options{SingleCaller: true, Key: httpx.KeyFromBody("/payment/id")})

	inv := inventory.New(inventory.Options{UnsafeMethods: []string{"POST", "PATCH", "PUT", "DELETE"}})
	mux := inventory.NewServeMux(inv, nil)
	mux.Handle("POST /orders", ok, authenticate, hard)                             // guard as middleware
	mux.Handle("PATCH /orders/{id}", soft(ok), authenticate)                       // guard on the handler
	mux.HandleFunc("GET /orders/{id}", ok)                                         // safe, unguarded
	mux.Handle("POST /payments", ok, body)                                         // key in the body
	mux.Handle("POST /quotes", authenticate(hard(ok)))                             // guard hidden: listed as a gap
	mux.Handle("DELETE /orders/{id}", ok)                                          // unsafe by configuration, unguarded
	mux.Handle("/legacy/", ok)                                                     // every method, unguarded
	mux.Handle("/v1/carts", ok, httpx.Guard(g, httpx.Options{SingleCaller: true})) // every method, POST and PATCH guarded

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: New does not connect
	defer rdb.Close()
	if _, err := redisstream.New(rdb, newGuard(time.Hour), func(context.Context, consumerx.Message) error { return nil },
		redisstream.Options{Stream: "orders", Group: "shipping", Consumer: "c1",
			Process: consumerx.Options{Inventory: inv, MessageType: "order.paid"}}); err != nil {
		t.Fatal(err)
	}

	invtest.SameRows(t, inv, []string{
		"http | /legacy/ | * | none |  |  |  |  | ServeMux | GAP | every method, unguarded: DELETE, PATCH, POST, PUT",
		"http | /orders | POST | hard | header | Idempotency-Key | tenant | 24h | ServeMux",
		"http | /orders/{id} | GET | none |  |  |  |  | ServeMux",
		"http | /orders/{id} | PATCH | soft | header | Idempotency-Key | user | 24h | ServeMux",
		"http | /orders/{id} | DELETE | none |  |  |  |  | ServeMux | GAP",
		"http | /payments | POST | hard | body | /payment/id | global | 24h | ServeMux",
		"http | /quotes | POST | none |  |  |  |  | ServeMux | GAP",
		"http | /v1/carts | POST | hard | header | Idempotency-Key | global | 24h | ServeMux",
		"http | /v1/carts | PATCH | hard | header | Idempotency-Key | global | 24h | ServeMux",
		"http | /v1/carts | * | none |  |  |  |  | ServeMux | GAP | other methods, unguarded: DELETE, PUT",
		"consumer | shipping | order.paid | hard | message_id | message id | global | 1h | consumerx",
	})
	if n := len(inv.Gaps()); n != 4 {
		t.Fatalf("%d gaps, want 4", n)
	}

	// The mux serves what it registered, middleware in order.
	srv := httptest.NewServer(mux)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader("x"))
	req.Header.Set("X-Account", "acme")
	req.Header.Set("Idempotency-Key", "k1")
	for i := range 2 {
		resp, err := srv.Client().Do(req.Clone(context.Background()))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || (resp.Header.Get(httpx.ReplayedHeader) == "true") != (i == 1) {
			t.Fatalf("POST /orders #%d: %d replayed %q", i, resp.StatusCode, resp.Header.Get(httpx.ReplayedHeader))
		}
	}
	srv.Client().CloseIdleConnections()
}

func TestServeMuxBadPatternListsNothing(t *testing.T) {
	inv := inventory.New(inventory.Options{})
	mux := inventory.NewServeMux(inv, nil)
	mux.Handle("POST /a", ok)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("a conflicting pattern did not panic")
			}
		}()
		mux.Handle("POST /a", ok)
	}()
	if n := len(inv.Entries()); n != 1 {
		t.Fatalf("%d entries, want 1", n)
	}
}

// TestPolicyOf: where a guard is found, and where it is not.
func TestPolicyOf(t *testing.T) {
	g := newGuard(time.Hour)
	idem := httpx.Guard(g, httpx.Options{SingleCaller: true})
	plain := func(next http.Handler) http.Handler { return http.HandlerFunc(next.ServeHTTP) }
	panicky := func(http.Handler) http.Handler { panic("must not be called with a placeholder") }
	cases := []struct {
		name  string
		h     http.Handler
		mws   []func(http.Handler) http.Handler
		found bool
	}{
		{"guarded handler", idem(ok), nil, true},
		{"guard among middleware", ok, []func(http.Handler) http.Handler{plain, idem}, true},
		{"after a panicking middleware", ok, []func(http.Handler) http.Handler{panicky, nil, idem}, true},
		{"behind an Unwrap", unwrapper{unwrapper{idem(ok)}}, nil, true},
		{"hidden in a closure", plain(idem(ok)), nil, false},
		{"no guard", ok, []func(http.Handler) http.Handler{plain, panicky}, false},
		{"nil handler", nil, nil, false},
		{"a wrapper that unwraps to itself", loop{}, nil, false},
	}
	for _, tc := range cases {
		if _, found := inventory.PolicyOf(tc.h, tc.mws...); found != tc.found {
			t.Errorf("%s: found %v, want %v", tc.name, found, tc.found)
		}
	}
}

type unwrapper struct{ next http.Handler }

func (u unwrapper) ServeHTTP(w http.ResponseWriter, r *http.Request) { u.next.ServeHTTP(w, r) }
func (u unwrapper) Unwrap() http.Handler                             { return u.next }

type loop struct{}

func (loop) ServeHTTP(http.ResponseWriter, *http.Request) {}
func (l loop) Unwrap() http.Handler                       { return l }

// small is a small inventory for the renderers.
func small(t *testing.T) *inventory.Inventory {
	t.Helper()
	g := newGuard(90 * time.Minute)
	inv := inventory.New(inventory.Options{})
	inv.AddRoute(inventory.Route{Router: "test", Method: "POST", Pattern: "/a|b", Handler: ok,
		Middleware: []func(http.Handler) http.Handler{httpx.Guard(g, httpx.Options{SingleCaller: true, Key: httpx.ComputedKey()})}})
	inv.AddRoute(inventory.Route{Router: "test", Method: "PATCH", Pattern: "/hooks", Handler: ok})
	inv.AddRoute(inventory.Route{Router: "test", Method: "GET", Pattern: "/hooks", Handler: ok})
	if _, err := consumerx.Wrap(g, "billing", func(context.Context, consumerx.Message) error { return nil },
		consumerx.Options{Inventory: inv, Key: func(m consumerx.Message) (string, error) { return m.Metadata["id"], nil }}); err != nil {
		t.Fatal(err)
	}
	return inv
}

func TestWriteMarkdown(t *testing.T) {
	var b strings.Builder
	if err := small(t).WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	want := `| path/handler | method/type | idempotency_required | key_source | dedup_scope | key | ttl | gap |
|---|---|---|---|---|---|---|---|
| /a\|b | POST | hard | computed | global | sha256(method, route, path, query, Content-Type, body); Idempotency-Key when sent | 1h30m |  |
| /hooks | GET | none | — | — | — | — |  |
| /hooks | PATCH | none | — | — | — | — | **gap** |
| consumer group billing | message | hard | computed | global | Options.Key | 1h30m |  |

1 gap: an unsafe route without an idempotency guard.
`
	if b.String() != want {
		t.Fatalf("markdown:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestMarshalJSON(t *testing.T) {
	body, err := json.Marshal(small(t))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Entries []map[string]any `json:"entries"`
		Gaps    int              `json:"gaps"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	if doc.Gaps != 1 || len(doc.Entries) != 4 {
		t.Fatalf("gaps %d entries %d: %s", doc.Gaps, len(doc.Entries), body)
	}
	first := doc.Entries[0]
	want := map[string]any{"kind": "http", "handler": "/a|b", "method": "POST", "idempotency_required": "hard",
		"key_source": "computed", "dedup_scope": "global", "ttl": "1h30m", "ttl_seconds": 5400.0, "gap": false, "router": "test"}
	for k, v := range want {
		if first[k] != v {
			t.Errorf("%s = %v, want %v", k, first[k], v)
		}
	}
	gap := doc.Entries[2]
	if gap["gap"] != true || gap["idempotency_required"] != "none" || gap["key_source"] != nil || gap["ttl"] != nil {
		t.Errorf("gap entry %v", gap)
	}
	if c := doc.Entries[3]; c["kind"] != "consumer" || c["handler"] != "billing" || c["key"] != "Options.Key" {
		t.Errorf("consumer entry %v", c)
	}
}

func TestHandler(t *testing.T) {
	h := small(t).Handler()
	get := func(target string, header ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", target, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	md := get("/debug/idempotency")
	if md.Code != 200 || !strings.HasPrefix(md.Header().Get("Content-Type"), "text/markdown") || !strings.HasPrefix(md.Body.String(), "| path/handler |") {
		t.Fatalf("markdown: %d %q %.40q", md.Code, md.Header().Get("Content-Type"), md.Body.String())
	}
	for _, rec := range []*httptest.ResponseRecorder{
		get("/debug/idempotency?format=json"),
		get("/debug/idempotency", "Accept", "application/json"),
	} {
		if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" || !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("json: %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
		}
	}
	if rec := get("/debug/idempotency?format=markdown", "Accept", "application/json"); !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/markdown") {
		t.Fatalf("format=markdown: %q", rec.Header().Get("Content-Type"))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/debug/idempotency", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST: %d allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}

// TestEntriesDeduplicated: a router walked twice, or several consumers of
// one group, give each row once; the inventory is safe to fill while it is
// read.
func TestEntriesDeduplicated(t *testing.T) {
	g := newGuard(time.Hour)
	inv := inventory.New(inventory.Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			_ = inv.Entries()
			_, _ = inv.MarshalJSON()
		}
	}()
	for range 50 {
		inv.AddRoute(inventory.Route{Method: "POST", Pattern: "/x", Handler: ok})
		if _, err := consumerx.Wrap(g, "g", func(context.Context, consumerx.Message) error { return nil }, consumerx.Options{Inventory: inv}); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if n := len(inv.Entries()); n != 2 {
		t.Fatalf("%d entries, want 2: %v", n, invtest.Rows(inv))
	}
}

func TestFormatTTL(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "", 24 * time.Hour: "24h", 10 * time.Minute: "10m",
		90 * time.Minute: "1h30m", 1500 * time.Millisecond: "1.5s", 2*time.Hour + 5*time.Second: "2h0m5s"} {
		if got := inventory.FormatTTL(d); got != want {
			t.Errorf("%s: %q, want %q", d, got, want)
		}
	}
}

// TestEntryComparable: an entry Entries returns equals one built by hand.
func TestEntryComparable(t *testing.T) {
	inv := inventory.New(inventory.Options{})
	inv.AddRoute(inventory.Route{Router: "r", Pattern: "/x", Handler: ok})
	want := inventory.Entry{Kind: inventory.KindHTTP, Handler: "/x", Method: inventory.AnyMethod, Required: inventory.RequireNone,
		Gap: true, Router: "r", Note: "every method, unguarded: PATCH, POST"}
	if got := inv.Entries(); len(got) != 1 || got[0] != want {
		t.Fatalf("%+v, want %+v", got, want)
	}
}
