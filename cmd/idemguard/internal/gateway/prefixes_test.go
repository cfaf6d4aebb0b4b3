package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestUpstreamPrefixesAreOneUpstream: "POST /orders" forwarded to
// http://app/api reaches the app as POST /api/orders, and so did POST
// /api/orders through the pass-through to http://app, unguarded (or
// under a wide route's scope): the same key ran the order again. A
// request the app gets as a route's path is served by that route, under
// its scope, forwarded where it was going; and a variant of the route
// (/Orders) through the pass-through, which the app gets as /Orders, not
// /api/orders, is passed through there, not sent to the route's prefix.
func TestUpstreamPrefixesAreOneUpstream(t *testing.T) {
	routes := basicConfig[:strings.Index(basicConfig, "routes:")] + "routes:\n  - pattern: POST /orders\n    upstream: {upstream}/api\n"
	for _, c := range []struct{ name, tmpl string }{
		{"pass-through", routes},
		{"a wide route", routes + "  - pattern: POST /{path...}\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newUpstream(t)
			e := startGateway(t, c.tmpl, u.URL)
			if r := post(t, e.srv.URL+"/orders", "k-prefix", `{"order":"p1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated || !strings.Contains(r.body, `"path":"/api/orders"`) {
				t.Fatalf("first: %d %q", r.status, r.body)
			}
			for _, p := range []string{"/api/orders", "/API/Orders/"} {
				if r := post(t, e.srv.URL+p, "k-prefix", `{"order":"p1"}`, "X-Account-Id", "acme"); r.status < 400 {
					t.Errorf("POST %s with the key of POST /orders (both the app's /api/orders): %d %q; want it guarded under that key", p, r.status, r.body)
				}
			}
			if s := send(t, e.srv.URL+"/api/orders", "post", "", "k-prefix-4"); s != http.StatusNotImplemented {
				t.Errorf("post /api/orders: %d; want it refused (501) as a guarded method spelt another way", s)
			}
			if n := u.count("p1"); n != 1 {
				t.Errorf("the app ran the order %d times, want 1", n)
			}
			for i := range 2 {
				r := post(t, e.srv.URL+"/api/orders", "k-prefix-2", `{"order":"p2"}`, "X-Account-Id", "acme")
				if r.status != http.StatusCreated || r.replayed() != (i > 0) || !strings.Contains(r.body, `"path":"/api/orders"`) {
					t.Errorf("POST /api/orders, try %d: %d replayed=%v %q; want the app's answer for /api/orders, then its replay", i, r.status, r.replayed(), r.body)
				}
			}
			if n := u.count("p2"); n != 1 {
				t.Errorf("the app ran /api/orders %d times, want 1", n)
			}
		})
	}
	u := newUpstream(t)
	e := startGateway(t, routes, u.URL)
	if r := post(t, e.srv.URL+"/Orders", "k-prefix-3", `{"order":"p3"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated || !strings.Contains(r.body, `"path":"/Orders"`) {
		t.Errorf("POST /Orders through the pass-through: %d %q; want the app's answer for /Orders (not the route's /api/Orders)", r.status, r.body)
	}
}
