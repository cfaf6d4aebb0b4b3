// Package chiwalk lists the routes of a chi router in an inventory.
package chiwalk

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/idemguard/idemguard/inventory"
)

// Add walks r as chi.Walk does and lists each route in inv, with the
// guard found among its middleware (r.Use, r.With, r.Group, r.Route,
// mounted subrouters' middleware) or on its handler. A route registered
// for every method (r.Handle, r.HandleFunc) is one inventory.AnyMethod
// route; methods registered on their own are listed on their own, and
// settle its gaps only when they are in the same router's tree (not in a
// mounted router, nor in another router walked into inv). A method or a
// catch-all registered on a mount's own pattern (r.Post("/api/*", h) after
// r.Mount("/api", sub)) is listed too: chi serves it there, and the
// mounted router never sees it. Walk it after
// every route is registered; routes added later are not listed. The
// router's NotFound and MethodNotAllowed handlers are not listed: they
// must not have effects a repeat would double. Routers mounted in each
// other are an error (inv may then hold some of their routes).
func Add(inv *inventory.Inventory, r chi.Routes) error {
	if inv == nil || r == nil {
		return errors.New("chiwalk: nil inventory or router")
	}
	return walk(inv, r, "", nil, nil)
}

// ownMiddlewares is what r's ServeHTTP runs its routes behind: its
// Middlewares, unless r is an inline router (r.With, r.Group), whose
// middleware chi puts into the handlers registered through it (each a
// *chi.ChainHandler, whose middleware the walk reads) and not around the
// tree it shares with the router it came from: mounted, it serves that
// router's own routes without them.
func ownMiddlewares(r chi.Routes) []middleware {
	if v := reflect.ValueOf(r); v.Kind() == reflect.Pointer && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
		if f := v.Elem().FieldByName("inline"); f.IsValid() && f.Kind() == reflect.Bool && f.Bool() {
			return nil
		}
	}
	return r.Middlewares()
}

type middleware = func(http.Handler) http.Handler

// walk follows chi.Walk (chi v5 tree.go), keeping a catch-all route whole.
// inside holds the routers mounted above r: routers mounted in each other
// (which chi serves) would be walked for ever.
func walk(inv *inventory.Inventory, r chi.Routes, parent string, parentMw []middleware, inside []chi.Routes) error {
	if slices.ContainsFunc(inside, func(o chi.Routes) bool { return sameRouter(o, r) }) {
		at := strings.TrimSuffix(strings.ReplaceAll(parent, "/*/", "/"), "/*")
		return fmt.Errorf("chiwalk: the router mounted at %s is mounted inside itself: its routes have no end to list", at)
	}
	inside = append(inside, r)
	// The node of r's routes: chi serves a path from the first router whose
	// tree holds it, so a catch-all on a router above a mounted one keeps
	// every method of its pattern whatever the mounted router registers.
	var node any = r
	if reflect.TypeOf(r).Kind() != reflect.Pointer {
		node = new(byte) // not known to be comparable: a node of its own, settling nothing else
	}
	for _, route := range r.Routes() {
		mws := slices.Concat(parentMw, ownMiddlewares(r))
		pattern := strings.ReplaceAll(parent+route.Pattern, "/*/", "/")
		add := func(method string, h http.Handler) {
			rt := inventory.Route{Router: "chi", Method: method, Pattern: pattern, Handler: h, Middleware: mws, Node: node}
			if chain, ok := h.(*chi.ChainHandler); ok {
				rt.Handler, rt.Middleware = chain.Endpoint, slices.Concat(mws, chain.Middlewares)
			}
			inv.AddRoute(rt)
		}
		if route.SubRoutes != nil {
			// A method (r.Post) or every method (r.Handle) registered on
			// the mount's own pattern after Mount is served there, by the
			// router above: the mounted router never sees it.
			mount := route.Handlers["*"]
			for method, h := range route.Handlers {
				switch {
				case method == "*" && !mounted(h):
					add(inventory.AnyMethod, h)
				case method != "*" && !sameHandler(h, mount):
					add(method, h)
				}
			}
			if chain, ok := mount.(*chi.ChainHandler); ok {
				mws = append(mws, chain.Middlewares...)
			}
			if err := walk(inv, route.SubRoutes, parent+route.Pattern, mws, inside); err != nil {
				return err
			}
			continue
		}
		all, hasAll := route.Handlers["*"]
		if hasAll {
			add(inventory.AnyMethod, all)
		}
		for method, h := range route.Handlers {
			if method == "*" || (hasAll && sameHandler(h, all)) {
				continue // part of the catch-all registration
			}
			add(method, h)
		}
	}
	return nil
}

// sameRouter reports whether a and b serve one tree of routes: the same
// router, or routers made from one by With or Group, which share its tree.
func sameRouter(a, b chi.Routes) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if va.Kind() != reflect.Pointer || vb.Kind() != reflect.Pointer || va.IsNil() || vb.IsNil() {
		return false // not known to be comparable
	}
	if va.Pointer() == vb.Pointer() {
		return true
	}
	if va.Type() != vb.Type() || va.Elem().Kind() != reflect.Struct {
		return false
	}
	ta, tb := va.Elem().FieldByName("tree"), vb.Elem().FieldByName("tree")
	return ta.IsValid() && ta.Kind() == reflect.Pointer && !ta.IsNil() && ta.Pointer() == tb.Pointer()
}

// mounted reports whether h is the handler chi's Mount registers (with
// the middleware of r.With(...).Mount around it). A handler not known as
// one is listed as a route of its own: a false gap rather than a route
// missed.
func mounted(h http.Handler) bool {
	if chain, ok := h.(*chi.ChainHandler); ok {
		h = chain.Endpoint
	}
	v := reflect.ValueOf(h)
	if !v.IsValid() || v.Kind() != reflect.Func {
		return false
	}
	fn := runtime.FuncForPC(v.Pointer())
	return fn != nil && strings.HasPrefix(fn.Name(), "github.com/go-chi/chi/v5.(*Mux).Mount.")
}

// sameHandler reports whether a and b are one registration's handler, as
// chi itself tells (func values by their code, others by ==).
func sameHandler(a, b http.Handler) bool {
	if a == nil || b == nil {
		return a == b
	}
	av, bv := reflect.ValueOf(a), reflect.ValueOf(b)
	switch {
	case av.Type() != bv.Type():
		return false
	case av.Kind() == reflect.Func:
		return av.Pointer() == bv.Pointer()
	case av.Type().Comparable():
		return a == b
	}
	return false
}
