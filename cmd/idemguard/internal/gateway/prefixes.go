package gateway

import (
	"context"
	"net/http"
	"net/url"
	"strings"
)

// Upstream path prefixes. A route's upstream may name a path prefix: with
// "upstream: http://app/api", "POST /orders" reaches the app as POST
// /api/orders. When the pass-through, or another route, forwards to the
// same server under another prefix ("upstream: http://app"), the app's
// POST /api/orders is a request away through it: POST /api/orders at the
// gateway, unguarded, or guarded under another route's scope. So a
// request whose path, as that server gets it (the prefix main forwards
// it with, joined to its path, loosened), matches a route's path as the
// route sends it to the same server is served by that route, under its
// scope, and forwarded where main would send it (route.via): the same key
// is the same request (422 if it differs), never a second effect. The
// other way round, a path variant is served by the route it loosens to
// only when that route sends it to the same prefix: under another prefix
// of the same server it is another request (POST /Orders through
// http://app is the app's /Orders, not the route's /api/orders).

// serverID names the server of an upstream: scheme and host, lower case,
// without the scheme's default port.
func serverID(u *url.URL) string {
	if u == nil {
		return ""
	}
	id := upstreamID(u)
	return strings.TrimSuffix(id, strings.TrimSuffix(u.Path, "/"))
}

// viaKey is the context key of the proxy a route forwards a request with
// when main would send it to another prefix of the route's server.
type viaKey struct{}

// viaProxy is the proxy the request's context names, else p.
func viaProxy(ctx context.Context, p transparent) transparent {
	if v, ok := ctx.Value(viaKey{}).(transparent); ok {
		return v
	}
	return p
}

// prefixes builds, for every server that gets requests under more than one
// path prefix (the routes' upstreams and the pass-through's), the routes'
// patterns as that server sees them, and each route's proxies to the
// other prefixes of its server (route.via).
func (gw *Gateway) prefixes(routes []*route, chains []http.Handler) map[string]*http.ServeMux {
	targets := map[string]map[string]*url.URL{} // by serverID, by upstreamID
	add := func(u *url.URL) {
		if targets[serverID(u)] == nil {
			targets[serverID(u)] = map[string]*url.URL{}
		}
		targets[serverID(u)][upstreamID(u)] = u
	}
	add(gw.cfg.Upstream)
	for _, rt := range routes {
		add(rt.cfg.Upstream)
	}
	var byServer map[string]*http.ServeMux
	for i, rt := range routes {
		ts := targets[serverID(rt.cfg.Upstream)]
		if len(ts) < 2 {
			continue
		}
		rt.via = map[string]transparent{}
		for id, u := range ts {
			if id != upstreamID(rt.cfg.Upstream) {
				rt.via[id] = gw.newProxy(rt, u)
			}
		}
		if byServer == nil {
			byServer = map[string]*http.ServeMux{}
		}
		sm := byServer[serverID(rt.cfg.Upstream)]
		if sm == nil {
			sm = http.NewServeMux()
			byServer[serverID(rt.cfg.Upstream)] = sm
		}
		prefix := fold(strings.TrimSuffix(rt.cfg.Upstream.Path, "/"))
		patterns, host := hostless(rt.cfg)
		for _, p := range patterns {
			m, rest, _ := strings.Cut(p, " ")
			tryHandle(sm, m+" "+prefix+rest, variantRoute{rt: rt, handler: chains[i], host: host})
		}
	}
	return byServer
}

// target is the upstream main sends r to (main's route's, or the
// pass-through's at "/"); nil when r is not forwarded.
func (v *variantMux) target(main *route, pattern string) *url.URL {
	switch {
	case main != nil:
		return main.cfg.Upstream
	case pattern == "/":
		return v.passThroughURL
	}
	return nil
}

// viewMatch finds the route that guards r's method on r's path as the
// server main sends it to gets it, under another prefix than main's: the
// route, with the proxy to main's prefix.
func (v *variantMux) viewMatch(r *http.Request, main *route, pattern string) (variantRoute, bool) {
	t := v.target(main, pattern)
	sm := v.byServer[serverID(t)]
	if t == nil || sm == nil {
		return variantRoute{}, false
	}
	vr, ok := lookupLoose(sm, r, loosePath(singleJoiningSlash(t.Path, r.URL.Path)), "")
	if !ok || vr.rt == main || !vr.rt.methods[r.Method] || upstreamID(vr.rt.cfg.Upstream) == upstreamID(t) {
		return variantRoute{}, false // none, main's, or the same prefix's (variants, hosts.go)
	}
	vr.via = vr.rt.via[upstreamID(t)]
	return vr, true
}

// elsewhere reports whether vr's route sends requests to another prefix
// of the server main sends r to: its path there is another request.
func (v *variantMux) elsewhere(vr variantRoute, main *route, pattern string) bool {
	t := v.target(main, pattern)
	return t != nil && serverID(t) == serverID(vr.rt.cfg.Upstream) && upstreamID(t) != upstreamID(vr.rt.cfg.Upstream)
}

// singleJoiningSlash joins a prefix and a path as ReverseProxy's SetURL
// does.
func singleJoiningSlash(a, b string) string {
	aslash, bslash := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/")
	switch {
	case aslash && bslash:
		return a + b[1:]
	case !aslash && !bslash:
		return a + "/" + b
	}
	return a + b
}
