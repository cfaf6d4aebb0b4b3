package inventory

import (
	"fmt"
	"net/http"
	"strings"
)

// ServeMux is an http.ServeMux that lists every route registered through
// it in an Inventory (an http.ServeMux cannot enumerate its routes). It
// serves exactly as the ServeMux it wraps.
//
//	mux := inventory.NewServeMux(inv, nil)
//	mux.Handle("POST /orders", createOrder, authenticate, httpx.Guard(g, opts))
//	mux.Handle("GET /debug/idempotency", inv.Handler())
type ServeMux struct {
	mux *http.ServeMux
	inv *Inventory
}

// NewServeMux returns a ServeMux that registers on mux (a new
// http.ServeMux if nil) and lists in inv. Routes mux already has are
// served but not listed: register every route through the ServeMux.
func NewServeMux(inv *Inventory, mux *http.ServeMux) *ServeMux {
	if inv == nil {
		panic("inventory.NewServeMux: nil Inventory")
	}
	if mux == nil {
		mux = http.NewServeMux()
	}
	return &ServeMux{mux: mux, inv: inv}
}

// Handle registers h for pattern, as http.ServeMux.Handle does (and panics
// as it does on a bad or conflicting pattern), behind middleware applied
// outermost first: Handle(p, h, a, b) serves a(b(h)). A guard among the
// middleware, or on h, is found and listed; pass the guard as middleware
// rather than inside another handler so the inventory can see it. A nil
// middleware panics, naming the pattern, before anything is registered.
func (m *ServeMux) Handle(pattern string, h http.Handler, middleware ...func(http.Handler) http.Handler) {
	if h == nil {
		panic("inventory.ServeMux: nil handler for " + pattern)
	}
	for i, mw := range middleware {
		if mw == nil {
			panic(fmt.Sprintf("inventory.ServeMux: nil middleware (argument %d of the middleware) for %s", i+1, pattern))
		}
	}
	served := h
	for i := len(middleware) - 1; i >= 0; i-- {
		served = middleware[i](served)
	}
	m.mux.Handle(pattern, served) // panics first on a bad pattern: nothing is listed then
	method, path := splitPattern(pattern)
	// A node of its own: ServeMux matches a pattern's method in its exact
	// case, so "patch" (as fetch sends PATCH) passes "PATCH /x" by for the
	// catch-all "/x", which must keep PATCH among its gaps.
	m.inv.AddRoute(Route{Router: "ServeMux", Method: method, Pattern: path, Handler: h, Middleware: middleware, Node: new(byte)})
}

// HandleFunc is Handle for a handler function.
func (m *ServeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request), middleware ...func(http.Handler) http.Handler) {
	if h == nil {
		panic("inventory.ServeMux: nil handler for " + pattern)
	}
	m.Handle(pattern, http.HandlerFunc(h), middleware...)
}

// ServeHTTP serves r through the wrapped http.ServeMux.
func (m *ServeMux) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.mux.ServeHTTP(w, r) }

// Mux returns the wrapped http.ServeMux. Routes registered on it directly
// are served but not listed.
func (m *ServeMux) Mux() *http.ServeMux { return m.mux }

// splitPattern splits a ServeMux pattern "[METHOD ][HOST]/[PATH]" into
// its method ("" when it has none) and the rest.
func splitPattern(pattern string) (method, path string) {
	p := strings.TrimLeft(pattern, " \t")
	if i := strings.IndexAny(p, " \t"); i >= 0 {
		return p[:i], strings.TrimLeft(p[i:], " \t")
	}
	return "", p
}
