package gateway

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestPathVariantsAreGuarded: ServeMux matches a route's path exactly, but
// many upstreams do not (Express and ASP.NET ignore case and a trailing
// slash; servlet containers drop ;parameters). A guarded request sent to
// such a variant (/Orders, /orders/, /ORDERS;v=1) reached the upstream
// through the pass-through, unguarded, and ran its effect again under a
// key already used. The gateway serves these variants by the route they
// loosen to, under the route's scope: the same key there is the same key
// (a different path is a different request: 422), a new key is guarded,
// and the path goes to the upstream as the client sent it. Methods the
// route does not guard are passed through as before.
func TestPathVariantsAreGuarded(t *testing.T) {
	u := newUpstream(t) // counts every POST's order, whatever its path
	e := startGateway(t, basicConfig, u.URL)
	first := post(t, e.srv.URL+"/orders", "k-variant", `{"order":"v1"}`, "X-Account-Id", "acme")
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	for _, p := range []string{"/Orders", "/orders/", "/ORDERS/", "/orders;v=1", "/Orders%2F"} {
		r := post(t, e.srv.URL+p, "k-variant", `{"order":"v1"}`, "X-Account-Id", "acme")
		if r.status == http.StatusCreated || r.status < 400 {
			t.Errorf("POST %s with the key of POST /orders: %d %q; want it guarded under that key (422), not run again", p, r.status, r.body)
		}
	}
	if n := u.count("v1"); n != 1 {
		t.Fatalf("the upstream ran the order %d times, want 1", n)
	}
	// A new key on a variant is guarded: its retry is a replay.
	for i := range 2 {
		r := post(t, e.srv.URL+"/Orders/", "k-variant-2", `{"order":"v2"}`, "X-Account-Id", "acme")
		if r.status != http.StatusCreated || r.replayed() != (i > 0) || !strings.Contains(r.body, `"path":"/Orders/"`) {
			t.Fatalf("variant, try %d: %d replayed=%v %q; want the upstream's 201 for the path as sent, then its replay", i, r.status, r.replayed(), r.body)
		}
	}
	if n := u.count("v2"); n != 1 {
		t.Fatalf("the upstream ran the variant's order %d times, want 1", n)
	}
	// Unguarded methods on a variant pass through as before.
	res, err := http.Get(e.srv.URL + "/Orders")
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("GET /Orders: %d, want the upstream's answer", res.StatusCode)
	}
}

// TestRoutesDifferingOnlyInCaseRefused: two routes whose patterns differ
// only in case or a trailing slash would both own the requests of either
// (the variants above): the configuration is refused.
func TestRoutesDifferingOnlyInCaseRefused(t *testing.T) {
	for _, second := range []string{"POST /Orders", "POST /orders/{$}"} {
		_, err := Parse("t.yaml", []byte(`
upstream: http://127.0.0.1:1
redis: {addrs: ["127.0.0.1:6379"]}
defaults:
  caller: {header: X-Account-Id}
routes:
  - pattern: POST /orders
  - pattern: `+second+`
`))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "routes[1].pattern" || !strings.Contains(fe.Msg, "case") {
			t.Errorf("%q beside \"POST /orders\": %v; want routes[1].pattern refused (variants of one path)", second, err)
		}
	}
}

// TestVariantsUnderAGuardingRouteAreTheRoutes: beside "POST /orders", a
// route guarding POST for every path ("POST /{path...}", or a subtree)
// to the same upstream took /Orders, /orders/ and /orders;v=1 itself,
// under its own scope: the same key ran the order once under each route,
// twice on an upstream that takes them for /orders. A variant is served
// by the route it loosens to when both forward to the same upstream;
// other paths stay the wider route's, and a wider route with an upstream
// of its own keeps its variants (that upstream never sees /orders).
func TestVariantsUnderAGuardingRouteAreTheRoutes(t *testing.T) {
	for _, wide := range []string{"POST /{path...}", "POST /"} {
		u := newUpstream(t)
		e := startGateway(t, basicConfig+"  - pattern: "+wide+"\n", u.URL)
		if r := post(t, e.srv.URL+"/orders", "k-wide", `{"order":"w1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
			t.Fatalf("%s: first: %d %q", wide, r.status, r.body)
		}
		for _, p := range []string{"/Orders", "/orders/", "/orders;v=1"} {
			if r := post(t, e.srv.URL+p, "k-wide", `{"order":"w1"}`, "X-Account-Id", "acme"); r.status < 400 {
				t.Errorf("%s: POST %s with the key of POST /orders: %d %q; want it guarded under that key", wide, p, r.status, r.body)
			}
		}
		if n := u.count("w1"); n != 1 {
			t.Errorf("%s: the upstream ran the order %d times, want 1", wide, n)
		}
		for i := range 2 {
			if r := post(t, e.srv.URL+"/payments", "k-wide-2", `{"order":"w2"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated || r.replayed() != (i > 0) {
				t.Errorf("%s: POST /payments, try %d: %d replayed=%v; want the wide route's answer, then its replay", wide, i, r.status, r.replayed())
			}
		}
		if n := u.count("w2"); n != 1 {
			t.Errorf("%s: the upstream ran /payments %d times, want 1", wide, n)
		}
	}
	a, b := newUpstream(t), newUpstream(t)
	e := startGateway(t, basicConfig+"  - pattern: POST /{path...}\n    upstream: "+b.URL+"\n", a.URL)
	for _, p := range []string{"/orders", "/Orders"} {
		if r := post(t, e.srv.URL+p, "k-own", `{"order":"o1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
			t.Errorf("POST %s: %d %q", p, r.status, r.body)
		}
	}
	if na, nb := a.count("o1"), b.count("o1"); na != 1 || nb != 1 {
		t.Errorf("orders run: /orders's upstream %d, the wide route's %d; want 1 each (/Orders stays the wide route's)", na, nb)
	}
}

// TestManyOverridesLookedUpOnce: a request may name a guarded method in
// thousands of override fields, list elements and _method parameters;
// each was looked up on the routes (guards: ServeMux and the variants,
// each as long as the path), so a request of a megabyte of header and
// path cost billions of steps. Each guarded method is looked up once.
func TestManyOverridesLookedUpOnce(t *testing.T) {
	calls := 0
	guards := func(r *http.Request, m string) bool { calls++; return false }
	h := methodVariants(guards, []string{"PATCH", "POST", "PUT"}, 1<<20, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	r := httptest.NewRequest("POST", "/"+strings.Repeat("a", 1<<16)+"?"+strings.Repeat("_method=PATCH&%5Fmethod=put&", 1000), nil)
	for range 1000 {
		r.Header.Add("X-HTTP-Method-Override", "PATCH, patch ,PUT")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusNoContent || calls > 3 {
		t.Errorf("%d, %d route lookups; want it passed on after one lookup per method named (2)", rec.Code, calls)
	}
}
