package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// looseUpstream is an upstream that, like ASP.NET Core (HttpMethods
// compares ignoring case) or Werkzeug (it upper-cases the method), takes a
// method in any case, and ignores the Host (the proxy sets its own): it
// counts every POST, however spelt.
func looseUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.EqualFold(r.Method, http.MethodPost) {
			n.Add(1)
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(s.Close)
	return s, &n
}

// send sends one request with the given method and Host, the key and the
// caller, and returns its status.
func send(t *testing.T, url, method, host, key string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(`{"order":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("X-Account-Id", "acme")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return res.StatusCode
}

// TestMethodCaseVariantsNotPassedThrough: a method name is case-sensitive
// to ServeMux, but not to every upstream. "post /orders" matched no route
// and went through the pass-through, unguarded, to an upstream that ran
// it as a POST every time. A request whose method is a guarded method
// in another case is refused (501), never forwarded; with a route for
// every path too, where the route's own proxy passes other methods.
func TestMethodCaseVariantsNotPassedThrough(t *testing.T) {
	for _, tmpl := range []string{basicConfig, basicConfig + "  - pattern: /{path...}\n    methods: [PUT]\n"} {
		u, n := looseUpstream(t)
		e := startGateway(t, tmpl, u.URL)
		if s := send(t, e.srv.URL+"/orders", "POST", "", "k-method"); s != http.StatusCreated {
			t.Fatalf("POST: %d", s)
		}
		for _, m := range []string{"post", "Post", "pOST"} {
			if s := send(t, e.srv.URL+"/orders", m, "", "k-method"); s < 400 {
				t.Errorf("%s /orders with the key of POST /orders: %d; want it refused", m, s)
			}
		}
		if got := n.Load(); got != 1 {
			t.Errorf("the upstream ran the POST %d times, want 1", got)
		}
	}
}

// TestHostCaseVariantsAreGuarded: a host name is case-insensitive (and may
// end in a dot), but ServeMux matches a pattern's host exactly: a POST to
// "API.example.com/orders" missed the route "POST api.example.com/orders"
// and reached the upstream through the pass-through, unguarded.
func TestHostCaseVariantsAreGuarded(t *testing.T) {
	u, n := looseUpstream(t)
	e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "POST api.example.com/orders", 1), u.URL)
	if s := send(t, e.srv.URL+"/orders", "POST", "api.example.com", "k-host"); s != http.StatusCreated {
		t.Fatalf("POST: %d", s)
	}
	for _, h := range []string{"API.example.com", "Api.Example.Com:80", "api.example.com.", "API.EXAMPLE.COM."} {
		if s := send(t, e.srv.URL+"/Orders", "POST", h, "k-host"); s < 400 {
			t.Errorf("POST %s/Orders with the key of POST api.example.com/orders: %d; want it guarded under that key", h, s)
		}
		if s := send(t, e.srv.URL+"/orders", "POST", h, "k-host"); s != http.StatusCreated {
			t.Errorf("POST %s/orders with the key of POST api.example.com/orders: %d; want its replay", h, s)
		}
	}
	if got := n.Load(); got != 1 {
		t.Errorf("the upstream ran the POST %d times, want 1", got)
	}
}

// TestUnicodeCaseVariantsAreGuarded: upstreams that ignore case the way
// Java's equalsIgnoreCase does (Spring with case-insensitive matching)
// take "ſ" (U+017F, upper case S) for "s" and "ı" (U+0131, upper case I)
// for "i"; lower-casing alone left /orderſ unguarded on its way to the
// route /orders.
func TestUnicodeCaseVariantsAreGuarded(t *testing.T) {
	u, n := looseUpstream(t)
	e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "POST /invoices", 1), u.URL)
	if s := send(t, e.srv.URL+"/invoices", "POST", "", "k-fold"); s != http.StatusCreated {
		t.Fatalf("POST: %d", s)
	}
	for _, p := range []string{"/invoiceſ", "/%C4%B1nvoices", "/INVOICEſ"} {
		if s := send(t, e.srv.URL+p, "POST", "", "k-fold"); s < 400 {
			t.Errorf("POST %s with the key of POST /invoices: %d; want it guarded under that key", p, s)
		}
	}
	if got := n.Load(); got != 1 {
		t.Errorf("the upstream ran the POST %d times, want 1", got)
	}
}

// TestMethodOverrideNotPassedThrough: many frameworks (Express's
// method-override, ASP.NET Core's UseHttpMethodOverride, Laravel, Jersey)
// run a POST carrying X-HTTP-Method-Override: PATCH as a PATCH. On a route
// guarding PATCH only, such a POST went through the pass-through and ran
// the PATCH again under a key already used. A request whose override
// field (or _method query parameter) names a guarded method other than
// its own is refused, never forwarded; so is a field listing one
// ("PATCH, POST": Express's method-override runs the first, which went
// through as no method at all).
func TestMethodOverrideNotPassedThrough(t *testing.T) {
	var n atomic.Int64
	u := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		m := r.Method
		if o := r.Header.Get("X-HTTP-Method-Override"); m == http.MethodPost && o != "" {
			// Express's method-override takes a list's first element.
			m = strings.ToUpper(strings.TrimSpace(strings.Split(o, ",")[0]))
		}
		if o := r.URL.Query().Get("_method"); r.Method == http.MethodPost && o != "" {
			m = strings.ToUpper(o)
		}
		if m == http.MethodPatch {
			n.Add(1)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(u.Close)
	e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "PATCH /orders/{id}", 1), u.URL)
	do := func(method, path string, header ...string) int {
		req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(`{"qty":2}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "k-override")
		req.Header.Set("X-Account-Id", "acme")
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		return res.StatusCode
	}
	if s := do("PATCH", "/orders/1"); s != http.StatusOK {
		t.Fatalf("PATCH: %d", s)
	}
	for _, c := range [][]string{
		{"/orders/1", "X-HTTP-Method-Override", "PATCH"},
		{"/orders/1", "X-HTTP-Method-Override", "patch"},
		{"/orders/1", "X-HTTP-Method", "PATCH"},
		{"/orders/1", "X-Method-Override", "PATCH"},
		{"/orders/1?_method=PATCH"},
		{"/orders/1", "X-HTTP-Method-Override", "PATCH, POST"},
		{"/orders/1", "X-HTTP-Method-Override", "POST,patch"},
	} {
		if s := do("POST", c[0], c[1:]...); s < 400 {
			t.Errorf("POST %s %v with the key of PATCH /orders/1: %d; want it refused", c[0], c[1:], s)
		}
	}
	if got := n.Load(); got != 1 {
		t.Errorf("the upstream ran the PATCH %d times, want 1", got)
	}
	// An override naming the request's own method, or one not guarded, is
	// no variant.
	if s := do("POST", "/orders/1", "X-HTTP-Method-Override", "GET"); s != http.StatusOK {
		t.Errorf("POST with an override naming GET: %d, want it passed through", s)
	}
}

// TestMethodVariantsElsewherePassThrough: a method spelt another way is
// refused only where a route guards that method; elsewhere it passes
// through as before.
func TestMethodVariantsElsewherePassThrough(t *testing.T) {
	u, _ := looseUpstream(t)
	e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "PATCH /orders/{id}", 1), u.URL)
	for _, c := range [][]string{{"post", "/orders/1"}, {"POST", "/users/1", "X-HTTP-Method-Override", "PATCH"}, {"patch", "/users/1"}} {
		req, err := http.NewRequest(c[0], e.srv.URL+c[1], strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		for i := 2; i+1 < len(c); i += 2 {
			req.Header.Set(c[i], c[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Errorf("%v: %d, want the upstream's 201 (no route guards it)", c, res.StatusCode)
		}
	}
}

// TestMethodOverrideOnAGuardedRequest: a request a route guards as it is
// is claimed whatever method it names: it is served, once.
func TestMethodOverrideOnAGuardedRequest(t *testing.T) {
	u, n := looseUpstream(t)
	e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "/orders/{id}", 1), u.URL)
	for i := range 2 {
		r := post(t, e.srv.URL+"/orders/1", "k-guarded-override", `{}`, "X-Account-Id", "acme", "X-HTTP-Method-Override", "PATCH")
		if r.status != http.StatusCreated || r.replayed() != (i > 0) {
			t.Fatalf("try %d: %d replayed=%v %q; want the upstream's 201, then its replay", i, r.status, r.replayed(), r.body)
		}
	}
	if got := n.Load(); got != 1 {
		t.Errorf("the upstream ran it %d times, want 1", got)
	}
}

// TestEncodedSlashVariantsAreGuarded: ServeMux takes %2F for a character
// of a segment, not a separator, so it neither redirects /orders%2F%2F
// nor matches it; upstreams that decode the path before routing (Spring's
// UrlPathHelper, which also merges slashes) take it for /orders/ or
// /orders. The variant check asked whether the decoded path was clean,
// found "/orders//" was not, and passed it through unguarded.
func TestEncodedSlashVariantsAreGuarded(t *testing.T) {
	u := newUpstream(t) // counts every POST's order, whatever its path
	e := startGateway(t, basicConfig, u.URL)
	if r := post(t, e.srv.URL+"/orders", "k-slash", `{"order":"s1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
		t.Fatalf("first: %d %q", r.status, r.body)
	}
	for _, p := range []string{"/orders%2F%2F", "/Orders%2F%2F%2F", "/x%2F..%2Forders", "/orders%2F.", "/orders%2F%2F;v=1"} {
		r := post(t, e.srv.URL+p, "k-slash", `{"order":"s1"}`, "X-Account-Id", "acme")
		if r.status < 400 {
			t.Errorf("POST %s with the key of POST /orders: %d %q; want it guarded under that key", p, r.status, r.body)
		}
	}
	if n := u.count("s1"); n != 1 {
		t.Fatalf("the upstream ran the order %d times, want 1", n)
	}
}

// TestVariantsUnderAnotherRouteAreGuarded: a variant of a guarded route
// that another route's pattern matches (a subtree "/api/" or "/{path...}"
// route guarding other methods) was served by that route, which passes
// the methods it does not guard through unguarded: only the pass-through
// "/" looked for variants. A request such a route does not guard is
// guarded by the route its path loosens to, if that one guards it.
func TestVariantsUnderAnotherRouteAreGuarded(t *testing.T) {
	for _, other := range []string{"/api/", "/{path...}"} {
		u := newUpstream(t)
		e := startGateway(t, strings.Replace(basicConfig, "POST /orders", "POST /api/orders", 1)+
			"  - pattern: "+other+"\n    methods: [PUT]\n", u.URL)
		if r := post(t, e.srv.URL+"/api/orders", "k-under", `{"order":"u1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
			t.Fatalf("%s: first: %d %q", other, r.status, r.body)
		}
		for _, p := range []string{"/api/Orders", "/api/orders/", "/api/orders;v=1"} {
			r := post(t, e.srv.URL+p, "k-under", `{"order":"u1"}`, "X-Account-Id", "acme")
			if r.status < 400 {
				t.Errorf("%s: POST %s with the key of POST /api/orders: %d %q; want it guarded under that key", other, p, r.status, r.body)
			}
		}
		if n := u.count("u1"); n != 1 {
			t.Errorf("%s: the upstream ran the order %d times, want 1", other, n)
		}
	}
}
