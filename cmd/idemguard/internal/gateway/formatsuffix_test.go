package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync/atomic"
	"testing"
)

// railsUpstream stands in for a Rails application with `post "/orders"`
// (or `resources :orders`): Rails' router (Journey) gives every route an
// optional format segment, "/orders(.:format)", the format being a
// segment without '/', '.' or '?'; so POST /orders.json runs
// orders#create as POST /orders does. Spring MVC before 5.3 (suffix
// pattern matching, on by default) takes "/orders.*" for "/orders" too.
// It counts the creates it runs.
func railsUpstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	route := regexp.MustCompile(`^/orders(\.[^/.?]+)?/?$`) // Journey also drops a trailing slash
	var n atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost && route.MatchString(r.URL.Path) {
			n.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"created":true}`)
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(s.Close)
	return s, &n
}

// TestFormatSuffixVariantGuarded: a route's path with a format suffix
// (POST /orders.json for POST /orders), which Rails and older Spring
// route to the same action, is guarded by that route under its scope: the
// same key there is another request of the key (422), and a retry of a
// new key sent there is replayed. (It reached the pass-through unguarded,
// and the upstream's create ran once per delivery; found by review.)
func TestFormatSuffixVariantGuarded(t *testing.T) {
	u, n := railsUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	if r := post(t, e.srv.URL+"/orders", "k-format", `{"order":"f1"}`, "X-Account-Id", "acme"); r.status != http.StatusCreated {
		t.Fatalf("POST /orders: %d %q", r.status, r.body)
	}
	if r := post(t, e.srv.URL+"/orders.json", "k-format", `{"order":"f1"}`, "X-Account-Id", "acme"); r.status != http.StatusUnprocessableEntity {
		t.Errorf("POST /orders.json with the key of POST /orders: %d %q, want 422", r.status, r.body)
	}
	for i := range 2 {
		r := post(t, e.srv.URL+"/orders.json", "k-format-2", `{"order":"f2"}`, "X-Account-Id", "acme")
		if r.status != http.StatusCreated || r.replayed() != (i == 1) {
			t.Errorf("POST /orders.json, try %d: %d replayed %v, want 201 replayed %v", i+1, r.status, r.replayed(), i == 1)
		}
	}
	if got := n.Load(); got != 2 {
		t.Fatalf("the upstream ran %d creates for two keys, want 2", got)
	}
	// Not a format suffix: a last segment of dots only, or with two
	// suffixes, passes through as before.
	for _, p := range []string{"/orders.", "/.json", "/orders.tar.gz"} {
		if r := post(t, e.srv.URL+p, "", `{}`); r.status != http.StatusNotFound {
			t.Errorf("POST %s without a key: %d, want the upstream's 404 (passed through)", p, r.status)
		}
	}
}

func TestFormatless(t *testing.T) {
	for p, want := range map[string]string{
		"/orders.json": "/orders", "/a/b/cancel.xml": "/a/b/cancel", "/orders": "", "/orders.": "",
		"/.json": "", "/orders.tar.gz": "", "/v1.2/orders": "", "/": "",
	} {
		if got := formatless(p); got != want {
			t.Errorf("formatless(%q) = %q, want %q", p, got, want)
		}
	}
}
