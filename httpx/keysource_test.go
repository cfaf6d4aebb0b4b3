package httpx_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/inventory"
)

// The key sources beside the header, as a client meets them: the same
// conformance story as a header key (a retry replays, a different request
// under the same key gets 422, a missing key 400), with the key read from
// the JSON body or computed from the request.

func jsonCT() []string { return []string{"Content-Type", "application/json"} }

func TestComputedKeyRetryReplays(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Key: httpx.ComputedKey()}))
	url := srv.URL + "/orders"

	first := do(t, c, "POST", url, `{"sku":"a","qty":1}`, jsonCT()...)
	retry := do(t, c, "POST", url, `{"sku":"a","qty":1}`, jsonCT()...)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d replayed %v (%s)", first.status, first.replayed(), first.body)
	}
	if !retry.replayed() || retry.status != first.status || !bytes.Equal(retry.body, first.body) {
		t.Fatalf("retry with the same body: %d replayed %v body %q, want the first's %q", retry.status, retry.replayed(), retry.body, first.body)
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times for a retried request, want 1", n)
	}

	// Anything else the key covers makes another request, which runs.
	others := []struct {
		name, method, url, body string
		header                  []string
	}{
		{"other body", "POST", url, `{"sku":"a","qty":2}`, jsonCT()},
		{"other path", "POST", url + "/x", `{"sku":"a","qty":1}`, jsonCT()},
		{"other query", "POST", url + "?dry=1", `{"sku":"a","qty":1}`, jsonCT()},
		{"other method", "PATCH", url, `{"sku":"a","qty":1}`, jsonCT()},
		{"other content type", "POST", url, `{"sku":"a","qty":1}`, []string{"Content-Type", "text/plain"}},
		{"empty body", "POST", url, "", nil},
	}
	for i, o := range others {
		r := do(t, c, o.method, o.url, o.body, o.header...)
		if r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("%s: %d replayed %v (%s), want a run of its own", o.name, r.status, r.replayed(), r.body)
		}
		if n := h.runs.Load(); n != int64(i+2) {
			t.Fatalf("%s: handler ran %d times, want %d", o.name, n, i+2)
		}
		// and its own retry replays it
		if r2 := do(t, c, o.method, o.url, o.body, o.header...); !r2.replayed() || !bytes.Equal(r2.body, r.body) {
			t.Fatalf("%s, retried: %d replayed %v", o.name, r2.status, r2.replayed())
		}
	}
	if n := h.runs.Load(); n != int64(1+len(others)) {
		t.Fatalf("handler ran %d times, want %d", n, 1+len(others))
	}
	// The stored key is the computed one, in the route's scope.
	if n := e.records(t); n != 1+len(others) {
		t.Fatalf("%d records, want %d", n, 1+len(others))
	}
}

// TestComputedKeyPatternRoute: two paths of one route pattern are two
// requests: the second runs (no 422 for a key the client never sent).
func TestComputedKeyPatternRoute(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	m := http.NewServeMux()
	m.Handle("POST /orders/{id}/pay", guarded(e, h, httpx.Options{Key: httpx.ComputedKey()}))
	srv, c := serve(t, m)
	for _, id := range []string{"1", "2"} {
		first := do(t, c, "POST", srv.URL+"/orders/"+id+"/pay", `{"amount":10}`)
		retry := do(t, c, "POST", srv.URL+"/orders/"+id+"/pay", `{"amount":10}`)
		if first.status != http.StatusCreated || first.replayed() || !retry.replayed() || !bytes.Equal(retry.body, first.body) {
			t.Fatalf("order %s: %d replayed %v (%s), retry replayed %v", id, first.status, first.replayed(), first.body, retry.replayed())
		}
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestComputedKeyConcurrentCopies(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Key: httpx.ComputedKey(), Wait: 30 * time.Second}))
	const n = 20
	replies := make([]reply, n)
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-begin
			r, err := send(context.Background(), c, "POST", srv.URL+"/orders", `{"sku":"z"}`)
			if err != nil {
				t.Error(err)
			}
			replies[i] = r
		})
	}
	close(begin)
	wg.Wait()
	if runs := h.runs.Load(); runs != 1 {
		t.Fatalf("%d copies of one request sent at once ran the handler %d times, want 1", n, runs)
	}
	for i, r := range replies {
		if r.status != http.StatusCreated || !bytes.Equal(r.body, replies[0].body) {
			t.Fatalf("copy %d: %d %q, want every copy to get %q", i, r.status, r.body, replies[0].body)
		}
	}
}

func TestComputedKeyHeaders(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Key: httpx.ComputedKey("x-client-order")}))
	url := srv.URL + "/orders"
	body := `{"sku":"a"}`

	a := do(t, c, "POST", url, body, "X-Client-Order", "1", "X-Request-Id", "r1")
	// A field that is not named changes nothing: a retry with a new
	// request id replays.
	a2 := do(t, c, "POST", url, body, "X-Client-Order", "1", "X-Request-Id", "r2")
	if a.replayed() || !a2.replayed() || !bytes.Equal(a2.body, a.body) {
		t.Fatalf("retry with another unnamed field: first replayed %v, retry replayed %v", a.replayed(), a2.replayed())
	}
	// A named field that changes makes another request.
	b := do(t, c, "POST", url, body, "X-Client-Order", "2")
	if b.replayed() || b.status != http.StatusCreated {
		t.Fatalf("other X-Client-Order: %d replayed %v", b.status, b.replayed())
	}
	// The field's absence is a value of its own.
	none := do(t, c, "POST", url, body)
	if none.replayed() {
		t.Fatal("no X-Client-Order replayed a request that had one")
	}
	if n := h.runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}

// TestComputedKeyClientKeyWins: a request that carries Idempotency-Key on
// a computed route is keyed by it, so a client can tell two identical
// orders apart, and a malformed one is refused as on a header route.
func TestComputedKeyClientKeyWins(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Key: httpx.ComputedKey()}))
	url := srv.URL + "/orders"
	body := `{"sku":"a"}`

	one := do(t, c, "POST", url, body, key("order-1")...)
	two := do(t, c, "POST", url, body, key("order-2")...)
	if one.replayed() || two.replayed() || bytes.Equal(one.body, two.body) {
		t.Fatalf("two keys, one body: replayed %v/%v; want two runs", one.replayed(), two.replayed())
	}
	if r := do(t, c, "POST", url, body, key("order-1")...); !r.replayed() || !bytes.Equal(r.body, one.body) {
		t.Fatalf("order-1 again: replayed %v", r.replayed())
	}
	if r := do(t, c, "POST", url, `{"sku":"b"}`, key("order-1")...); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("order-1 with another body: %d, want 422", r.status)
	}
	if r := do(t, c, "POST", url, body, key("a b")...); r.status != http.StatusBadRequest || r.problem(t).Type != httpx.ProblemMalformedKey {
		t.Fatalf("malformed key: %d %s", r.status, r.body)
	}
	// Without a key the body is computed into one: a third run, then replays.
	k1 := do(t, c, "POST", url, body)
	k2 := do(t, c, "POST", url, body)
	if k1.replayed() || !k2.replayed() {
		t.Fatalf("keyless: replayed %v then %v", k1.replayed(), k2.replayed())
	}
	if n := h.runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3", n)
	}
}

// TestComputedKeyPerCaller: identical requests of two callers are two
// requests; a caller's retry replays its own response.
func TestComputedKeyPerCaller(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	tenant := func(r *http.Request) string { return r.Header.Get("X-Tenant") }
	srv, c := serve(t, guarded(e, h, httpx.Options{Tenant: tenant, Key: httpx.ComputedKey()}))
	url := srv.URL + "/orders"
	a := do(t, c, "POST", url, "same", "X-Tenant", "alice")
	b := do(t, c, "POST", url, "same", "X-Tenant", "bob")
	if a.replayed() || b.replayed() || bytes.Equal(a.body, b.body) {
		t.Fatalf("bob got alice's response: %q / %q", a.body, b.body)
	}
	if a2 := do(t, c, "POST", url, "same", "X-Tenant", "alice"); !a2.replayed() || !bytes.Equal(a2.body, a.body) {
		t.Fatalf("alice's retry: replayed %v", a2.replayed())
	}
	if r := do(t, c, "POST", url, "same"); r.status != http.StatusUnauthorized {
		t.Fatalf("no caller: %d, want 401", r.status)
	}
	if n := h.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

func TestBodyKeyLikeHeaderKey(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Key: httpx.KeyFromBody("/order_id")}))
	url := srv.URL + "/orders"

	first := do(t, c, "POST", url, `{"order_id":"o-1","sku":"a"}`, jsonCT()...)
	retry := do(t, c, "POST", url, `{"order_id":"o-1","sku":"a"}`, jsonCT()...)
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("first: %d replayed %v (%s)", first.status, first.replayed(), first.body)
	}
	if !retry.replayed() || !bytes.Equal(retry.body, first.body) {
		t.Fatalf("retry: replayed %v body %q", retry.replayed(), retry.body)
	}
	// The record is under the body's key, in the route's scope.
	if rec, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /orders", ID: "o-1"}); err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("record of o-1: %+v, %v", rec, err)
	}
	cases := []struct {
		name, body string
		header     []string
		status     int
		typ        string
	}{
		{"same key, other body", `{"order_id":"o-1","sku":"b"}`, jsonCT(), 422, httpx.ProblemKeyMismatch},
		{"same key, other content type", `{"order_id":"o-1","sku":"a"}`, []string{"Content-Type", "text/plain"}, 422, httpx.ProblemKeyMismatch},
		{"missing field", `{"sku":"a"}`, jsonCT(), 400, httpx.ProblemMissingKey},
		{"null field", `{"order_id":null}`, jsonCT(), 400, httpx.ProblemMissingKey},
		{"empty body", ``, nil, 400, httpx.ProblemMissingKey},
		{"a header key is not read", `{"sku":"a"}`, with(jsonCT(), key("o-9")), 400, httpx.ProblemMissingKey},
		{"not JSON", `order_id=o-2`, nil, 400, httpx.ProblemMalformedKey},
		{"JSON with trailing bytes", `{"order_id":"o-2"} x`, jsonCT(), 400, httpx.ProblemMalformedKey},
		{"object value", `{"order_id":{"id":"o-2"}}`, jsonCT(), 400, httpx.ProblemMalformedKey},
		{"bool value", `{"order_id":true}`, jsonCT(), 400, httpx.ProblemMalformedKey},
		{"empty string", `{"order_id":""}`, jsonCT(), 400, httpx.ProblemMalformedKey},
		{"256 bytes", `{"order_id":"` + strings.Repeat("k", 256) + `"}`, jsonCT(), 400, httpx.ProblemMalformedKey},
		{"control character", `{"order_id":"o\u0001"}`, jsonCT(), 400, httpx.ProblemMalformedKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, c, "POST", url, tc.body, tc.header...)
			if r.status != tc.status {
				t.Fatalf("status %d, want %d (%s)", r.status, tc.status, r.body)
			}
			if p := r.problem(t); p.Type != tc.typ {
				t.Fatalf("type %q, want %q", p.Type, tc.typ)
			}
		})
	}
	if n := h.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if n := e.records(t); n != 1 {
		t.Fatalf("%d records, want 1: a rejected request stores nothing", n)
	}
	// A new key in the body is a new request; a number is a key as written;
	// the longest key fits.
	for _, body := range []string{`{"order_id":"o-2","sku":"b"}`, `{"order_id":12345}`, `{"order_id":"` + strings.Repeat("k", 255) + `"}`} {
		if r := do(t, c, "POST", url, body, jsonCT()...); r.status != http.StatusCreated || r.replayed() {
			t.Fatalf("%.40s: %d replayed %v (%s)", body, r.status, r.replayed(), r.body)
		}
	}
	if _, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /orders", ID: "12345"}); err != nil {
		t.Fatalf("record of the number key 12345: %v", err)
	}
}

func TestBodyKeyPointer(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Key: httpx.KeyFromBody("/meta/a~1b~0c/1")}))
	body := `{"meta":{"a/b~c":["x","ref-7"],"a":{"b":["no","no"]}}}`
	if r := do(t, c, "POST", srv.URL+"/o", body); r.status != http.StatusCreated {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if _, err := e.g.Get(context.Background(), guard.Key{Scope: "POST /o", ID: "ref-7"}); err != nil {
		t.Fatalf("record of ref-7: %v", err)
	}
	if r := do(t, c, "POST", srv.URL+"/o", `{"meta":{"a/b~c":["x"]}}`); r.status != http.StatusBadRequest {
		t.Fatalf("index past the end: %d", r.status)
	}
}

func TestBodyKeyOptional(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	srv, c := serve(t, guarded(e, h, httpx.Options{Key: httpx.KeyFromBody("/order_id"), Optional: true}))
	for _, body := range []string{`{"sku":"a"}`, `not json`, ``} {
		for range 2 {
			if r := do(t, c, "POST", srv.URL+"/o", body); r.status != http.StatusCreated || r.replayed() {
				t.Fatalf("%q without a key: %d replayed %v", body, r.status, r.replayed())
			}
		}
	}
	if h.runs.Load() != 6 || e.records(t) != 0 {
		t.Fatalf("runs %d records %d, want 6 and 0", h.runs.Load(), e.records(t))
	}
	// A key that is there is used; a malformed one is refused.
	r1 := do(t, c, "POST", srv.URL+"/o", `{"order_id":"k"}`)
	r2 := do(t, c, "POST", srv.URL+"/o", `{"order_id":"k"}`)
	if r1.replayed() || !r2.replayed() {
		t.Fatalf("with a key: replayed %v then %v", r1.replayed(), r2.replayed())
	}
	if r := do(t, c, "POST", srv.URL+"/o", `{"order_id":[1]}`); r.status != http.StatusBadRequest {
		t.Fatalf("malformed key on an optional route: %d", r.status)
	}
}

// TestBodyKeyLimits: the body limit holds as on a header route, before
// any key is read.
func TestBodyKeyLimits(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := &orders{}
	for _, ks := range []httpx.KeySource{httpx.KeyFromBody("/k"), httpx.ComputedKey()} {
		srv, c := serve(t, guarded(e, h, httpx.Options{Key: ks, MaxBody: 100}))
		big := `{"k":"big","pad":"` + strings.Repeat("x", 100) + `"}`
		if r := do(t, c, "POST", srv.URL+"/o", big); r.status != http.StatusRequestEntityTooLarge || r.problem(t).Type != httpx.ProblemBodyTooLarge {
			t.Fatalf("declared length: %d %s", r.status, r.body)
		}
		req, _ := http.NewRequest("POST", srv.URL+"/o", io.MultiReader(strings.NewReader(big)))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("chunked: %d", resp.StatusCode)
		}
	}
	if h.runs.Load() != 0 || e.records(t) != 0 {
		t.Fatalf("runs %d records %d after 413s", h.runs.Load(), e.records(t))
	}
}

// TestKeySourceHandlerSeesBody: a handler behind a body or computed key
// reads the whole body, as behind a header key.
func TestKeySourceHandlerSeesBody(t *testing.T) {
	e := newEnv(t, guard.Options{})
	for _, ks := range []httpx.KeySource{httpx.KeyFromBody("/k"), httpx.ComputedKey()} {
		var got atomic.Value
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got.Store(string(b))
		})
		req := httptest.NewRequest("POST", "/o", strings.NewReader(`{"k":"body-seen"}`))
		rec := httptest.NewRecorder()
		guarded(e, h, httpx.Options{Key: ks}).ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || got.Load() != `{"k":"body-seen"}` {
			t.Fatalf("%d, handler read %q", rec.Code, got.Load())
		}
	}
}

func TestGuardPolicy(t *testing.T) {
	e := newEnv(t, guard.Options{TTL: 90 * time.Minute})
	tenant := func(*http.Request) string { return "t" }
	cases := []struct {
		name string
		opts httpx.Options
		want inventory.Policy
	}{
		{"header", httpx.Options{SingleCaller: true},
			inventory.Policy{Required: inventory.RequireHard, KeySource: inventory.KeyHeader, Key: "Idempotency-Key",
				Scope: inventory.ScopeGlobal, TTL: 90 * time.Minute, Methods: []string{"POST", "PATCH"}}},
		{"optional header, tenant", httpx.Options{Tenant: tenant, Optional: true, Header: "x-request-key", Methods: []string{"PUT"}},
			inventory.Policy{Required: inventory.RequireSoft, KeySource: inventory.KeyHeader, Key: "X-Request-Key",
				Scope: inventory.ScopeTenant, TTL: 90 * time.Minute, Methods: []string{"PUT"}}},
		{"body, user", httpx.Options{Tenant: tenant, CallerScope: inventory.ScopeUser, Key: httpx.KeyFromBody("/id")},
			inventory.Policy{Required: inventory.RequireHard, KeySource: inventory.KeyBody, Key: "/id",
				Scope: inventory.ScopeUser, TTL: 90 * time.Minute, Methods: []string{"POST", "PATCH"}}},
		{"computed", httpx.Options{SingleCaller: true, Key: httpx.ComputedKey("X-A")},
			inventory.Policy{Required: inventory.RequireHard, KeySource: inventory.KeyComputed,
				Key:   "sha256(method, route, path, query, Content-Type, X-A, body); Idempotency-Key when sent",
				Scope: inventory.ScopeGlobal, TTL: 90 * time.Minute, Methods: []string{"POST", "PATCH"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := httpx.Guard(e.g, tc.opts)(http.NotFoundHandler())
			g, ok := h.(inventory.Guarded)
			if !ok {
				t.Fatalf("%T is not an inventory.Guarded", h)
			}
			got := g.IdempotencyPolicy()
			if got.Required != tc.want.Required || got.KeySource != tc.want.KeySource || got.Key != tc.want.Key ||
				got.Scope != tc.want.Scope || got.TTL != tc.want.TTL || strings.Join(got.Methods, ",") != strings.Join(tc.want.Methods, ",") {
				t.Fatalf("policy\n%+v\nwant\n%+v", got, tc.want)
			}
			if p, ok := inventory.PolicyOf(http.NotFoundHandler(), httpx.Guard(e.g, tc.opts)); !ok || p.KeySource != tc.want.KeySource {
				t.Fatalf("PolicyOf the middleware: %+v %v", p, ok)
			}
		})
	}
}

func TestKeySourceMisuse(t *testing.T) {
	e := newEnv(t, guard.Options{})
	panics := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s: no panic", name)
			}
		}()
		f()
	}
	panics("pointer without /", func() { httpx.KeyFromBody("order_id") })
	panics("bad escape", func() { httpx.KeyFromBody("/a~2") })
	panics("empty header name", func() { httpx.ComputedKey(" ") })
	panics("optional computed", func() {
		httpx.Guard(e.g, httpx.Options{SingleCaller: true, Optional: true, Key: httpx.ComputedKey()})
	})
	panics("user scope, single caller", func() {
		httpx.Guard(e.g, httpx.Options{SingleCaller: true, CallerScope: inventory.ScopeUser})
	})
	panics("global scope with tenant", func() {
		httpx.Guard(e.g, httpx.Options{Tenant: func(*http.Request) string { return "" }, CallerScope: inventory.ScopeGlobal})
	})
	// These are fine.
	httpx.KeyFromBody("")
	httpx.KeyFromBody("/")
	httpx.KeyFromBody("/a~0~1")
	httpx.Guard(e.g, httpx.Options{SingleCaller: true, CallerScope: inventory.ScopeGlobal})
}
