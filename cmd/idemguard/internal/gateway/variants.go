package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
)

// Path variants of guarded routes. ServeMux matches a route's path
// exactly: case counts, and /orders/ is not /orders. Many upstreams are
// looser (Express and ASP.NET ignore case and a trailing slash; servlet
// containers drop ;parameters from path segments), so a guarded request
// sent to /Orders, /orders/ or /orders;v=1 would reach the same handler
// of the upstream through the pass-through, unguarded. The gateway serves
// such a request by the route its path loosens to (case folded, no
// ;parameters, no trailing slash, no format suffix: /orders.json, as
// Rails and older Spring take it), under that route's scope, for the
// methods the route guards: the guarded set is at least as wide as what a
// loose upstream takes for the route. The path goes to the upstream as
// the client sent it; the same key on another variant is another request
// (422), never a second effect. Two routes whose patterns loosen alike
// are refused (checkPatterns). A route's host loosens too (lower case,
// no trailing dot, any port): host names are case-insensitive, and the
// pass-through may reach the same upstream. A request whose method is a
// guarded method in another case ("post"), or that names one in a
// method-override field (a POST with X-HTTP-Method-Override: PATCH) or
// _method parameter (query or form body: overrideparams.go), is refused
// (501), never forwarded: ServeMux would pass it through, and
// upstreams that take methods in any case (ASP.NET Core, Werkzeug) or
// honour overrides would run it.

// variantMux routes a request that the route main matches it to does not
// guard (the pass-through's, or another route's that guards other
// methods: a subtree "/api/", a "/{path...}") to the route its loosened
// path matches, if that one guards it.
type variantMux struct {
	main  *http.ServeMux // the gateway's routes, the pass-through at "/"
	loose *http.ServeMux // the routes' loosened patterns, each to its variantRoute
	next  http.Handler   // what serves everything else (main, wrapped)
	// methods are those some route guards: no other request is looked at.
	methods map[string]bool
	routes  map[string]*route // by pattern
	// byUpstream are the routes as each upstream sees them (hosts.go),
	// by upstreamID; nil when no route names a host.
	byUpstream  map[string]*http.ServeMux
	passThrough string // the pass-through's upstreamID
	// byServer are the routes as each server that gets requests under
	// more than one prefix sees them (prefixes.go), by serverID.
	byServer       map[string]*http.ServeMux
	passThroughURL *url.URL
}

// variantRoute is a route's handler chain, as main serves it.
type variantRoute struct {
	rt      *route
	handler http.Handler
	host    bool // the route's pattern names a host
	// via, if set, is the proxy the route forwards with (prefixes.go).
	via transparent
}

// serve serves r by vr's route, under its scope.
func (vr variantRoute) serve(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	if vr.via.ReverseProxy != nil {
		ctx = context.WithValue(ctx, viaKey{}, vr.via)
	}
	r2 := r.WithContext(ctx)
	r2.Pattern = vr.rt.cfg.Pattern // the route's scope
	vr.handler.ServeHTTP(w, r2)
}

func (v variantRoute) ServeHTTP(http.ResponseWriter, *http.Request) {} // never served by loose

// loosePattern is a route pattern loosened as loosePath loosens paths:
// case folded, and "/x/{$}" (a path with its trailing slash) as "/x".
func loosePattern(pattern string) string {
	method, rest, err := splitPattern(pattern)
	if err != nil {
		return ""
	}
	rest = fold(rest)
	if i := strings.IndexByte(rest, '/'); i >= 0 && rest[i:] != "/{$}" {
		rest = strings.TrimSuffix(rest, "/{$}")
	}
	if method == "" {
		return rest
	}
	return method + " " + rest
}

// fold folds s's case as the loosest upstreams do: to upper case, then
// lower, so that letters whose upper case is another's ("ſ" is "S", "ı"
// is "I", as Java's equalsIgnoreCase takes them) fold alike.
func fold(s string) string { return strings.ToLower(strings.ToUpper(s)) }

// loosePath folds p's case (fold), drops each segment's ;parameters, and
// cleans it (dot segments, repeated and trailing slashes).
func loosePath(p string) string {
	if strings.IndexByte(p, ';') >= 0 {
		segs := strings.Split(p, "/")
		for i, s := range segs {
			if j := strings.IndexByte(s, ';'); j >= 0 {
				segs[i] = s[:j]
			}
		}
		p = strings.Join(segs, "/")
	}
	// Cleaned: ServeMux redirects an unclean path, but one unclean only
	// once decoded (/orders%2F%2F, /x%2F..%2Forders) it passes on, to
	// upstreams that decode before they route.
	return path.Clean(fold(p))
}

// formatless returns p without the format suffix of its last segment
// ("/orders.json" is "/orders"), or "" if it has none: Rails routes every
// path with an optional one ("/orders(.:format)", the format without
// '.' or '/'), as Spring MVC did by default before 5.3 ("/orders.*").
func formatless(p string) string {
	seg := p[strings.LastIndexByte(p, '/')+1:]
	if i := strings.LastIndexByte(seg, '.'); i > 0 && i < len(seg)-1 && strings.IndexByte(seg[:i], '.') < 0 {
		return p[:len(p)-len(seg)+i]
	}
	return ""
}

// looseHost lowers h and drops its port and a trailing dot.
func looseHost(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// overrideFields are the header fields frameworks take a request's
// method from (Express's method-override, ASP.NET Core, Laravel, Jersey,
// Google's APIs); the _method parameter is overrideparams.go's.
var overrideFields = []string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// sameField reports whether header field name k names field name, in any
// case and with '_' for '-': CGI-style servers (Puma, PHP, wsgiref) read
// X_HTTP_METHOD_OVERRIDE and X-Http-Method-Override alike, as
// HTTP_X_HTTP_METHOD_OVERRIDE.
func sameField(k, name string) bool {
	return strings.EqualFold(strings.ReplaceAll(k, "_", "-"), strings.ReplaceAll(name, "_", "-"))
}

// delAnySpelling deletes from h every field named name in any spelling
// (sameField).
func delAnySpelling(h http.Header, name string) {
	for k := range h {
		if sameField(k, name) {
			delete(h, k)
		}
	}
}

// isOverrideField reports whether a request's header field name is one of
// overrideFields in any spelling (sameField).
func isOverrideField(name string) bool {
	return slices.ContainsFunc(overrideFields, func(f string) bool { return sameField(name, f) })
}

// methodVariants refuses (501) a request that spells a method another way
// (in another case, or in a method-override field or _method parameter,
// in its query or form body, while its own method is another) when a route guards that
// method for it (guards) and none guards the request as it is: upstreams
// that take such a spelling would run the guarded method for a request
// ServeMux passes through unguarded.
// The rest go to next.
// A form body is read (overrideparams.go) only when a route guards one of
// methods, other than the request's own, for it, up to maxBody bytes.
func methodVariants(guards func(r *http.Request, method string) bool, methods []string, maxBody int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// refused reports whether r names m, a method a route guards for
		// it, spelt as n. A request a route guards itself is claimed:
		// whatever the upstream runs it as, it runs once.
		// Each guarded method is looked up once: a request may name one
		// in many thousand fields or parameters, each lookup as long as
		// its path.
		var looked uint64
		self := 0 // guards(r, r.Method): 0 not asked, 1 no, 2 yes
		refused := func(n string) bool {
			m := strings.ToUpper(strings.TrimSpace(n))
			i := slices.Index(methods, m)
			if m == r.Method || i < 0 || i < 64 && looked&(1<<i) != 0 {
				return false
			}
			if i < 64 {
				looked |= 1 << i
			}
			if !guards(r, m) {
				return false
			}
			if self == 0 {
				self = 1
				if guards(r, r.Method) {
					self = 2
				}
			}
			if self == 2 {
				return false
			}
			(&problem{Type: "about:blank", Title: "Not Implemented", Status: http.StatusNotImplemented,
				Detail: "this " + r.Method + " request names the method " + m + ", which the gateway guards: " +
					"send it as " + m + " itself (methods are case-sensitive; method overrides are not forwarded for guarded methods)"}).write(w)
			return true
		}
		if refused(r.Method) {
			return
		}
		for f, vs := range r.Header {
			if !isOverrideField(f) {
				continue
			}
			for _, v := range vs {
				// A list: Express's method-override takes its first
				// element ("PATCH, GET" is a PATCH); each is looked at.
				for v != "" {
					var n string
					n, v, _ = strings.Cut(v, ",")
					if refused(n) {
						return
					}
				}
			}
		}
		for _, n := range queryOverrides(r) {
			if refused(n) {
				return
			}
		}
		if form, boundary := formBody(r); form && otherGuarded(r, guards, methods) {
			names, err := bodyOverrides(r, boundary, maxBody)
			switch {
			case errors.Is(err, errFormTooLarge):
				(&problem{Type: "about:blank", Title: "Content Too Large", Status: http.StatusRequestEntityTooLarge,
					Detail: err.Error() + ", and a route guards another method for this request"}).write(w)
				return
			case err != nil:
				(&problem{Type: "about:blank", Title: "Bad Request", Status: http.StatusBadRequest, Detail: err.Error()}).write(w)
				return
			}
			for _, n := range names {
				if refused(n) {
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// otherGuarded reports whether a route guards one of methods, other than
// r's own, for r, and none guards r as it is.
func otherGuarded(r *http.Request, guards func(r *http.Request, method string) bool, methods []string) bool {
	for _, m := range methods {
		if m != r.Method && guards(r, m) {
			return !guards(r, r.Method)
		}
	}
	return false
}

// clean reports whether ServeMux takes p, an escaped path, as it is (else
// it redirects).
func clean(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

func (v *variantMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !v.methods[r.Method] {
		v.next.ServeHTTP(w, r)
		return
	}
	if _, p := v.main.Handler(r); (v.routes[p] == nil || !v.routes[p].methods[r.Method]) &&
		r.Method != http.MethodConnect && clean(r.URL.EscapedPath()) {
		if vr, ok := v.match(r); ok && vr.rt.methods[r.Method] {
			vr.serve(w, r)
			return
		}
	} else if main := v.routes[p]; main != nil && r.Method != http.MethodConnect && clean(r.URL.EscapedPath()) {
		// Guarded by main's route (a "/{path...}", a subtree "/api/"); the
		// route its path loosens to owns it if it guards it for the same
		// upstream, which takes both for one request: else the same key
		// would run once under each scope. A host route may own it too
		// (hosts.go).
		// A route its path, as main's upstream gets it, matches under
		// another prefix owns it too (prefixes.go).
		vr, ok := v.viewMatch(r, main, p)
		if !ok {
			owner := main
			if lv, lok := v.looseMatch(r); lok && lv.rt != main && upstreamID(lv.rt.cfg.Upstream) == upstreamID(main.cfg.Upstream) {
				vr, ok, owner = lv, true, lv.rt
			}
			if hv, hok := v.upstreamView(r, owner); hok {
				vr, ok = hv, true
			}
		}
		if ok {
			vr.serve(w, r)
			return
		}
	}
	v.next.ServeHTTP(w, r)
}

// match finds the route r's loosened path matches, as itself or, for a
// subtree pattern ("/orders/"), with its slash; else the host route that
// guards r under another host (upstreamView).
func (v *variantMux) match(r *http.Request) (variantRoute, bool) {
	_, p := v.main.Handler(r)
	main := v.routes[p]
	if vr, ok := v.viewMatch(r, main, p); ok {
		return vr, true // prefixes.go
	}
	if vr, ok := v.looseMatch(r); ok && !v.elsewhere(vr, main, p) {
		if hv, ok := v.upstreamView(r, vr.rt); ok {
			return hv, true // hosts.go
		}
		return vr, true
	}
	if main == nil && p != "/" {
		return variantRoute{}, false // not forwarded
	}
	return v.upstreamView(r, main)
}

// looseMatch finds the route r's loosened path matches, as itself or, for
// a subtree pattern ("/orders/"), with its slash, if it guards r's method.
func (v *variantMux) looseMatch(r *http.Request) (variantRoute, bool) {
	vr, ok := lookupLoose(v.loose, r, loosePath(r.URL.Path), looseHost(r.Host))
	if !ok || !vr.rt.methods[r.Method] {
		return variantRoute{}, false // none, or not guarding r's method: only upstreamView may
	}
	return vr, true
}

// lookupLoose returns the route m takes r to with its path replaced by lp
// or, for a subtree pattern ("/orders/"), by lp with its slash, or by lp
// without a format suffix (formatless), and its Host by host: the first
// of these that reaches a route.
func lookupLoose(m *http.ServeMux, r *http.Request, lp, host string) (variantRoute, bool) {
	for _, p := range []string{lp, lp + "/", formatless(lp)} {
		if p == "" {
			continue
		}
		u := *r.URL
		u.Path, u.RawPath = p, ""
		lr := r.WithContext(r.Context())
		lr.URL, lr.Host = &u, host
		h, _ := m.Handler(lr)
		if vr, ok := h.(variantRoute); ok {
			return vr, true
		}
	}
	return variantRoute{}, false
}
