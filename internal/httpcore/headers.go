package httpcore

import (
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// hopByHop are the fields that describe one connection, not the response
// (RFC 9110 section 7.6.1, and Proxy-Authenticate/-Authorization, which
// RFC 2616 counted among them). They are never stored, whatever
// Options.ReplayHeader says.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// private are the fields DefaultReplayHeader leaves out because they belong
// to one client at one moment: a cookie may carry a session, and
// Authentication-Info / Proxy-Authentication-Info carry the next nonce or
// proof of a login (RFC 9110 sections 11.6.3 and 11.7.3).
var private = map[string]bool{
	"Set-Cookie": true, "Authentication-Info": true, "Proxy-Authentication-Info": true,
}

// DefaultReplayHeader is the default Options.ReplayHeader. It keeps every
// field the handler set except Set-Cookie, Authentication-Info and
// Proxy-Authentication-Info (one client's, at one moment: replaying them
// could hand a session or a proof of login to whoever sends the key
// again).
//
// Whatever ReplayHeader says, these are never stored: the hop-by-hop
// fields (Connection, Keep-Alive, Proxy-Connection, Proxy-Authenticate,
// Proxy-Authorization, TE, Trailer, Transfer-Encoding, Upgrade), fields
// named in the response's Connection header, trailers
// (http.TrailerPrefix) and Idempotent-Replayed. Fields the handler did not
// set (those of middleware outside the Guard) are not stored either: a
// replay carries their values of the moment.
func DefaultReplayHeader(name string) bool { return !private[name] }

// connectionFields returns the fields h's Connection header names
// (canonical), which are hop-by-hop for this response; nil when none.
func connectionFields(h http.Header) map[string]bool {
	var conn map[string]bool
	for _, v := range h["Connection"] {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				if conn == nil {
					conn = map[string]bool{}
				}
				conn[textproto.CanonicalMIMEHeaderKey(f)] = true
			}
		}
	}
	return conn
}

// keepField reports whether field k, with values vs in the response
// header when the handler wrote its status, is stored for replays: the
// handler set or changed it relative to before (the header when the
// handler was called), and the replay rules keep it. conn is
// connectionFields of that header.
func (m *Engine) keepField(k string, vs []string, before http.Header, conn map[string]bool) bool {
	if len(vs) == 0 || slices.Equal(before[k], vs) {
		return false // absent, or as the outer middleware left it
	}
	if hopByHop[k] || conn[k] || k == ReplayedHeader || strings.HasPrefix(k, http.TrailerPrefix) {
		return false
	}
	return m.opts.ReplayHeader(k)
}

// resetHeader makes h what it was before the handler ran: the fields of
// outer middleware only.
func resetHeader(h, before http.Header) {
	clear(h)
	for k, vs := range before {
		h[k] = vs
	}
}
