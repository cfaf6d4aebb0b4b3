// Package muxwalk lists the routes of a gorilla/mux router in an
// inventory.
package muxwalk

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"unsafe"

	"github.com/gorilla/mux"

	"github.com/idemguard/idemguard/inventory"
)

// Add walks r with Router.Walk and lists each route in inv, with the
// guard found on its handler or among the middleware its router and the
// routers above it added with Use. A route without Methods is listed as
// inventory.AnyMethod. gorilla/mux serves a request with the first route
// that matches it, and a route may have matchers Add cannot read
// (Headers, MatcherFunc): a route without Methods is therefore listed
// with every unsafe method it leaves unguarded, even those another route
// of its path registers on its own (inventory.Route.Node is the route).
// Walk it after every route is registered; routes added later are not
// listed, nor are the NotFoundHandler and MethodNotAllowedHandler, which
// must not have effects a repeat would double.
//
// gorilla/mux keeps Use's middleware in an unexported field; Add reads it
// (with reflect and unsafe, read only). Should a later gorilla/mux rename
// the field, guards added with Use are no longer seen and their routes
// are listed as unguarded, gaps where the method is unsafe: a false gap,
// never a false guarantee. TestUseMiddlewareSeen pins the field.
func Add(inv *inventory.Inventory, r *mux.Router) error {
	if inv == nil || r == nil {
		return errors.New("muxwalk: nil inventory or router")
	}
	owner := map[*mux.Route]*mux.Router{} // the router each route belongs to
	err := r.Walk(func(route *mux.Route, router *mux.Router, ancestors []*mux.Route) error {
		owner[route] = router
		h := route.GetHandler()
		if h == nil {
			return nil // a subrouter's own route: its routes come next
		}
		if _, ok := h.(*mux.Router); ok {
			return nil // a router mounted as a handler: walked next
		}
		var mws []func(http.Handler) http.Handler
		for _, a := range ancestors {
			mws = append(mws, Middleware(owner[a])...)
		}
		mws = append(mws, Middleware(router)...)
		pattern, err := route.GetPathTemplate()
		if err != nil {
			pattern = "(no path template)"
		}
		if host, err := route.GetHostTemplate(); err == nil && host != "" {
			pattern = host + pattern
		}
		methods, err := route.GetMethods()
		if err != nil || len(methods) == 0 {
			methods = []string{inventory.AnyMethod}
		}
		for _, m := range methods {
			inv.AddRoute(inventory.Route{Router: "gorilla/mux", Method: m, Pattern: pattern, Handler: h, Middleware: mws, Node: route})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("muxwalk: %w", err)
	}
	return nil
}

// Middleware returns the middleware r.Use added to r (not to the routers
// above it), in the order they wrap a handler, outermost first. It is nil
// when r has none, or when this version of gorilla/mux keeps them
// elsewhere.
func Middleware(r *mux.Router) []func(http.Handler) http.Handler {
	if r == nil {
		return nil
	}
	f := reflect.ValueOf(r).Elem().FieldByName("middlewares")
	if !f.IsValid() || f.Kind() != reflect.Slice || !f.CanAddr() {
		return nil
	}
	f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
	var out []func(http.Handler) http.Handler
	for i := range f.Len() {
		if m, ok := f.Index(i).Interface().(interface {
			Middleware(http.Handler) http.Handler
		}); ok {
			out = append(out, m.Middleware)
		}
	}
	return out
}
