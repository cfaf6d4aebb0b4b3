package gateway

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"gopkg.in/yaml.v3"
)

// Other hosts of host routes. The gateway forwards with the upstream's
// own Host (ReverseProxy's SetURL): the upstream cannot tell
// api.example.com/orders from 10.0.0.5/orders, or from a request naming
// the gateway by its address. A route "POST api.example.com/orders"
// would leave the same effect a request away, unguarded, through the
// pass-through or another route forwarding to the same upstream. So a
// request with a method a host route guards, on a path that route takes
// (its variants too), under any other host, and that would be forwarded
// to the route's upstream unguarded, or by a route whose pattern is less
// specific as the upstream sees it, is served by that route, under its
// scope, as a variant is: the same key is the same request whatever the
// Host (replayed, or 422 if it differs), the effect runs once. A request
// the gateway forwards to another upstream (a route naming its own
// upstream for its host) is that route's business and stays as it is.
// X-Forwarded-Host (x_forwarded: set, the default) tells the upstream
// the client's Host, but the gateway does not rely on the upstream
// reading it: an upstream that routes by it still answers some host for
// a name it does not know. An upstream that serves tenants by host is
// told apart by its URL: give each host's route the upstream URL that
// names its tenant (its host is the Host the upstream gets). Two routes that would take the same requests to the
// same upstream under different hosts are refused at start
// (checkHostScopes): the same key would run once under each.

// upstreamID names an upstream as the requests forwarded to it are sent:
// scheme, host (lower case, without the scheme's default port) and path
// prefix.
func upstreamID(u *url.URL) string {
	if u == nil {
		return ""
	}
	scheme, host := strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	if p := u.Port(); (scheme == "http" && p == "80") || (scheme == "https" && p == "443") {
		host = strings.TrimSuffix(host, ":"+p)
	}
	return scheme + "://" + host + strings.TrimSuffix(u.Path, "/")
}

// hostless returns a route's patterns as its upstream sees them, one per
// method it guards: loosened (loosePattern), without the host, and
// whether the pattern names a host.
func hostless(r Route) (patterns []string, hasHost bool) {
	_, rest, err := splitPattern(loosePattern(r.Pattern))
	if err != nil {
		return nil, false
	}
	if i := strings.IndexByte(rest, '/'); i > 0 {
		rest, hasHost = rest[i:], true
	}
	for _, m := range r.Methods {
		patterns = append(patterns, m+" "+rest)
	}
	return patterns, hasHost
}

// upstreamView finds the route that serves r instead of owner (the route
// serving it, nil for the pass-through): the one whose pattern, as their
// upstream sees it (no host), is the most specific for r, when one of the
// two names a host. Both routes naming no host are the variants' business.
// So a host route serves its path under any other host, and a route for
// every host serves its path under a host whose route ServeMux prefers
// but which is less specific ("POST api.example.com/{path...}" beside
// "POST /orders"): else the same key would run once under each, as
// api.example.com/orders and 10.0.0.5/orders.
func (v *variantMux) upstreamView(r *http.Request, owner *route) (variantRoute, bool) {
	if v.byUpstream == nil {
		return variantRoute{}, false // no route names a host
	}
	target := v.passThrough
	if owner != nil {
		target = upstreamID(owner.cfg.Upstream)
	}
	hm := v.byUpstream[target]
	if hm == nil {
		return variantRoute{}, false
	}
	vr, ok := lookupLoose(hm, r, loosePath(r.URL.Path), "")
	if !ok || vr.rt == owner || !vr.rt.methods[r.Method] || !vr.host && (owner == nil || !owner.host) {
		return variantRoute{}, false
	}
	return vr, true
}

// checkHostScopes refuses two routes, one naming a host at least, that
// would take the same requests (a guarded method, a path) to the same
// upstream: the upstream cannot tell their hosts apart, and the same key
// would run once under each route's scope. So are two routes to one
// server under different path prefixes whose paths are the same there
// (prefixes.go).
func (d *decoder) checkHostScopes(c *Config, routes *yaml.Node) {
	type seen struct {
		index    int
		line     int
		patterns []string
		host     bool
	}
	byUpstream := map[string][]seen{}
	type prefixed struct {
		index    int
		line     int
		patterns []string // with the upstream's path prefix
		id       string   // the upstream's upstreamID
	}
	byServer := map[string][]prefixed{}
	for i, r := range c.Routes {
		if r.Pattern == "" || r.Upstream == nil {
			continue
		}
		patterns, host := hostless(r)
		node := patternNode(routes.Content[i])
		id := upstreamID(r.Upstream)
	earlier:
		for _, s := range byUpstream[id] {
			if !host && !s.host {
				continue // checkPatterns' business
			}
			m := http.NewServeMux()
			for _, p := range s.patterns {
				tryHandle(m, p)
			}
			for _, p := range patterns {
				if tryHandle(m, p) != "" {
					d.errorf(node, fmt.Sprintf("routes[%d].pattern", i), "%q and routes[%d] %q (line %d) take the same %s requests to the same upstream %s, "+
						"which cannot tell their hosts apart (the gateway sends it its own Host): the same key would run once under each route; "+
						"guard the path in one route, or give each host's route its own upstream",
						r.Pattern, s.index, c.Routes[s.index].Pattern, s.line, strings.Fields(p)[0], r.Upstream)
					break earlier
				}
			}
		}
		byUpstream[id] = append(byUpstream[id], seen{i, node.Line, patterns, host})
		// Routes to one server under different path prefixes
		// (prefixes.go): their paths as the server gets them.
		prefix := fold(strings.TrimSuffix(r.Upstream.Path, "/"))
		var full []string
		for _, p := range patterns {
			m, rest, _ := strings.Cut(p, " ")
			full = append(full, m+" "+prefix+rest)
		}
	server:
		for _, s := range byServer[serverID(r.Upstream)] {
			if s.id == id {
				continue // the same prefix: above, or checkPatterns'
			}
			m := http.NewServeMux()
			for _, p := range s.patterns {
				tryHandle(m, p)
			}
			for _, p := range full {
				if tryHandle(m, p) != "" {
					d.errorf(node, fmt.Sprintf("routes[%d].pattern", i), "%q and routes[%d] %q (line %d) take the same %s requests to the same upstream server, "+
						"the path prefixes of their upstreams (%s, %s) added: the same key would run once under each route; guard the path in one route",
						r.Pattern, s.index, c.Routes[s.index].Pattern, s.line, strings.Fields(p)[0], r.Upstream, c.Routes[s.index].Upstream)
					break server
				}
			}
		}
		byServer[serverID(r.Upstream)] = append(byServer[serverID(r.Upstream)], prefixed{i, node.Line, full, id})
	}
}

// patternNode is a route's pattern node (the route's own if it has none).
func patternNode(route *yaml.Node) *yaml.Node {
	for j := 0; j+1 < len(route.Content); j += 2 {
		if route.Content[j].Value == "pattern" {
			return route.Content[j+1]
		}
	}
	return route
}
