package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestOtherHostsOfAHostRouteAreGuarded is the reviewer's probe: the
// route "POST api.example.com/orders" forwards to the pass-through's
// upstream, with the upstream's own Host, so the upstream cannot tell
// api.example.com/orders from 10.0.0.5/orders. With the same key, Host
// api.example.com, then 10.0.0.5, then the gateway's own address (no Host
// override) ran the order 3 times: the other hosts went through the
// pass-through unguarded. They are served by the host route, under its
// scope: the order runs once, the others are its replay. The gateway
// sends X-Forwarded-Host (x_forwarded: set, the default) but does not rely
// on the upstream reading it: this one does not.
func TestOtherHostsOfAHostRouteAreGuarded(t *testing.T) {
	for _, c := range []struct{ name, tmpl string }{
		{"pass-through's upstream", strings.Replace(basicConfig, "POST /orders", "POST api.example.com/orders", 1)},
		{"upstream named twice", basicConfig[:strings.Index(basicConfig, "routes:")] + `routes:
  - pattern: POST api.example.com/orders
    upstream: {upstream}
  - pattern: /{path...}
    methods: [PUT]
    upstream: {upstream}
`},
		{"another route guarding the path for every host", basicConfig[:strings.Index(basicConfig, "routes:")] + `routes:
  - pattern: POST api.example.com/orders
  - pattern: POST /{path...}
`},
	} {
		t.Run(c.name, func(t *testing.T) {
			u, n := looseUpstream(t)
			e := startGateway(t, c.tmpl, u.URL)
			for _, h := range []string{"api.example.com", "10.0.0.5", "", "API.example.com:8443"} {
				if s := send(t, e.srv.URL+"/orders", "POST", h, "k-probe"); s != http.StatusCreated {
					t.Errorf("POST %q/orders: %d, want the order's answer (201) or its replay", h, s)
				}
			}
			if s := send(t, e.srv.URL+"/Orders/", "POST", "10.0.0.5", "k-probe"); s < 400 {
				t.Errorf("POST 10.0.0.5/Orders/ with the key of POST api.example.com/orders: %d; want it guarded under that key", s)
			}
			if s := send(t, e.srv.URL+"/orders", "post", "10.0.0.5", "k-probe-2"); s != http.StatusNotImplemented {
				t.Errorf("post 10.0.0.5/orders: %d; want it refused (501) as a guarded method spelt another way", s)
			}
			if got := n.Load(); got != 1 {
				t.Errorf("the upstream ran the order %d times, want 1", got)
			}
		})
	}
}

// TestHostRoutesToTheirOwnUpstreams: the legitimate multi-host setup, two
// host routes each with an upstream of its own, is unchanged: each host's
// order runs once on its own upstream, under its own scope (the same key
// on both is two orders), and a third host, which goes to the
// pass-through's upstream (neither route's), passes through.
func TestHostRoutesToTheirOwnUpstreams(t *testing.T) {
	ua, na := looseUpstream(t)
	ub, nb := looseUpstream(t)
	up, np := looseUpstream(t)
	tmpl := basicConfig[:strings.Index(basicConfig, "routes:")] + `routes:
  - pattern: POST a.example.com/orders
    upstream: ` + ua.URL + `
  - pattern: POST b.example.com/orders
    upstream: ` + ub.URL + `
`
	e := startGateway(t, tmpl, up.URL)
	for _, h := range []string{"a.example.com", "b.example.com", "a.example.com", "b.example.com"} {
		if s := send(t, e.srv.URL+"/orders", "POST", h, "k-multi"); s != http.StatusCreated {
			t.Errorf("POST %s/orders: %d", h, s)
		}
	}
	for range 2 {
		if s := send(t, e.srv.URL+"/orders", "POST", "c.example.com", "k-multi"); s != http.StatusCreated {
			t.Errorf("POST c.example.com/orders: %d", s)
		}
	}
	if a, b, p := na.Load(), nb.Load(), np.Load(); a != 1 || b != 1 || p != 2 {
		t.Errorf("orders run: a's upstream %d, b's %d, the pass-through's %d; want 1, 1, 2 (c.example.com is passed through)", a, b, p)
	}
}

// TestAWideHostRouteLeavesARouteForEveryHostItsPath: beside "POST
// /orders", a route "POST api.example.com/{path...}" to the same upstream
// took api.example.com/orders (ServeMux prefers a pattern naming the
// host) under its scope while 10.0.0.5/orders went to "POST /orders": the
// upstream cannot tell them apart, and the same key ran the order once
// under each. The route more specific as the upstream sees it serves
// both; the host route keeps its other paths.
func TestAWideHostRouteLeavesARouteForEveryHostItsPath(t *testing.T) {
	u, n := looseUpstream(t)
	e := startGateway(t, basicConfig[:strings.Index(basicConfig, "routes:")]+`routes:
  - pattern: POST api.example.com/{path...}
  - pattern: POST /orders
`, u.URL)
	for _, h := range []string{"api.example.com", "10.0.0.5", "API.example.com"} {
		if s := send(t, e.srv.URL+"/orders", "POST", h, "k-wide-host"); s != http.StatusCreated {
			t.Errorf("POST %s/orders: %d, want the order's answer (201) or its replay", h, s)
		}
	}
	for _, h := range []string{"API.example.com", "10.0.0.5"} {
		if s := send(t, e.srv.URL+"/Orders/", "POST", h, "k-wide-host"); s < 400 {
			t.Errorf("POST %s/Orders/ with the key of POST /orders: %d; want it guarded under that key", h, s)
		}
	}
	if got := n.Load(); got != 1 {
		t.Errorf("the upstream ran the order %d times, want 1", got)
	}
	for range 2 {
		if s := send(t, e.srv.URL+"/payments", "POST", "api.example.com", "k-wide-host-2"); s != http.StatusCreated {
			t.Errorf("POST api.example.com/payments: %d", s)
		}
	}
	if got := n.Load(); got != 2 {
		t.Errorf("the upstream ran %d POSTs, want 2 (/payments once, guarded by the host route)", got)
	}
}
