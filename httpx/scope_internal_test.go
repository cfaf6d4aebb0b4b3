package httpx

import (
	"net/http/httptest"
	"testing"
)

func TestDefaultScope(t *testing.T) {
	cases := []struct{ method, pattern, target, want string }{
		{"POST", "POST /orders", "/orders", "POST /orders"},
		{"POST", "POST  /orders", "/orders", "POST /orders"},
		{"POST", "POST\t/orders", "/orders", "POST /orders"},
		{"HEAD", "GET /orders", "/orders", "HEAD /orders"}, // GET patterns match HEAD
		{"POST", "/orders/{id}", "/orders/7", "POST /orders/{id}"},
		{"PATCH", "PATCH example.com/o/{id}", "/o/7", "PATCH example.com/o/{id}"},
		{"POST", "", "/a%2Fb/c", "POST /a%2Fb/c"},
	}
	for _, c := range cases {
		r := httptest.NewRequest(c.method, c.target, nil)
		r.Pattern = c.pattern
		if got := DefaultScope(r); got != c.want {
			t.Errorf("%s %q: %q, want %q", c.method, c.pattern, got, c.want)
		}
	}
	// A pattern that names the request's method, as ServeMux's "POST
	// /orders" does, is the scope as it is: no allocation per request.
	r := httptest.NewRequest("POST", "/orders", nil)
	r.Pattern = "POST /orders"
	if n := testing.AllocsPerRun(100, func() { _ = DefaultScope(r) }); n != 0 {
		t.Errorf("DefaultScope of a method pattern: %.0f allocations, want 0", n)
	}
}
