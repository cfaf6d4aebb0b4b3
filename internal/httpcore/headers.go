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
// named in the response's Connection header, and Idempotent-Replayed.
// Fields the handler did not set (those of middleware outside the Guard)
// are not stored either: a replay carries their values of the moment,
// except one the handler removed, which is stored as removed (a single
// empty value) and which a replay sends without. A replay has the
// Content-Type the first response had: the one net/http sniffed for it
// is stored, and a response that went out without one (the handler
// flushed before its body, set the field to nil, or removed outer
// middleware's) is replayed without one, not with a sniffed one or outer
// middleware's.
// Trailers the handler set (declared in Trailer and set after the status,
// or named with http.TrailerPrefix) are stored by the same rules, under
// their names, and a replay sends them as trailers.
func DefaultReplayHeader(name string) bool { return !private[name] }

// connectionFields returns the fields the Connection header of a
// response with fields h names (canonical), which are hop-by-hop for this
// response; nil when none.
func connectionFields(h []snapField) map[string]bool {
	var conn map[string]bool
	for _, f := range h {
		if !strings.EqualFold(f.name, "Connection") {
			continue
		}
		for _, v := range f.vals {
			for name := range strings.SplitSeq(v, ",") {
				if name = strings.TrimSpace(name); name != "" {
					if conn == nil {
						conn = map[string]bool{}
					}
					conn[textproto.CanonicalMIMEHeaderKey(name)] = true
				}
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
	if strings.HasPrefix(k, http.TrailerPrefix) || strings.HasPrefix(k, emptyMark) {
		return false
	}
	return m.replayable(k, conn)
}

// replayable applies the replay rules to field name k, in any case: a
// handler that writes w.Header()["set-cookie"] sends a Set-Cookie all the
// same, and it is no more replayed than one written canonically.
func (m *Engine) replayable(k string, conn map[string]bool) bool {
	if !validFieldName(k) {
		return false // net/http sends no such field (an empty name, a space): nor does the replay
	}
	k = textproto.CanonicalMIMEHeaderKey(k)
	if hopByHop[k] || conn[k] || k == ReplayedHeader {
		return false
	}
	return m.opts.ReplayHeader(k)
}

// keepRemoval reports whether field k, which outer middleware had set
// (it is in the header the handler was called with), is stored as removed
// because the header the handler wrote its status with (h, whose
// Connection field names conn) has no value for it: by the rules of
// keepField. Content-Type is left to the capture, which knows whether
// net/http sniffed one for the body (encodeHandlerResponse's untyped).
func (m *Engine) keepRemoval(k string, h []snapField, conn map[string]bool) bool {
	if k == "Content-Type" || hasValues(h, k) {
		return false
	}
	return !strings.HasPrefix(k, http.TrailerPrefix) && m.replayable(k, conn)
}

// removed is the value a field the response went out without is stored
// with: a single empty value (encodeHandlerResponse).
var removed = []string{""}

// hasValues reports whether field k of h has a value.
func hasValues(h []snapField, k string) bool {
	for _, f := range h {
		if f.name == k {
			return len(f.vals) > 0
		}
	}
	return false
}

// keepTrailer reports whether trailer field k (its name without
// http.TrailerPrefix), with values vs, is stored for replays: by the rules
// of keepField, but a trailer is the handler's whatever outer middleware
// set (it is sent after the handler returned).
func (m *Engine) keepTrailer(k string, vs []string, conn map[string]bool) bool {
	if len(vs) == 0 || k == "" || strings.HasPrefix(k, emptyMark) {
		return false
	}
	return m.replayable(k, conn)
}

// resetHeader makes h what it was before the handler ran: the fields of
// outer middleware only.
func resetHeader(h, before http.Header) {
	clear(h)
	for k, vs := range before {
		h[k] = vs
	}
}

// headerSnapshot is a response header as it was at one moment, as
// http.Header.Clone would keep it (each field's values copied, nil kept
// nil), held in the capture's own storage: a header of up to snapFields
// fields and snapValues values costs no allocation.
type headerSnapshot struct {
	fields       []snapField
	fieldsInline [snapFields]snapField
	valsInline   [snapValues]string
}

// snapField is one field of a headerSnapshot or of a header seen as a
// list (fieldsOf).
type snapField struct {
	name string
	vals []string
}

const (
	snapFields = 8
	snapValues = 8
)

// take makes s a copy of h.
func (s *headerSnapshot) take(h http.Header) {
	n := 0
	for _, vs := range h {
		n += len(vs)
	}
	vals := s.valsInline[:0]
	if n > cap(vals) {
		vals = make([]string, 0, n)
	}
	s.fields = s.fieldsInline[:0]
	if len(h) > cap(s.fields) {
		s.fields = make([]snapField, 0, len(h))
	}
	for k, vs := range h {
		if vs == nil {
			s.fields = append(s.fields, snapField{name: k})
			continue
		}
		at := len(vals)
		vals = append(vals, vs...) // within its capacity: the slices taken stay put
		s.fields = append(s.fields, snapField{name: k, vals: vals[at:len(vals):len(vals)]})
	}
}

// restore makes h the snapshot's fields (as resetHeader does with a map).
func (s *headerSnapshot) restore(h http.Header) {
	clear(h)
	for _, f := range s.fields {
		h[f.name] = f.vals
	}
}

// fieldsOf lists h's fields into scratch (grown if too small).
func fieldsOf(h http.Header, scratch []snapField) []snapField {
	out := scratch[:0]
	for k, vs := range h {
		out = append(out, snapField{name: k, vals: vs})
	}
	return out
}

// validFieldName reports whether k is a field name net/http writes: an
// RFC 9110 token (httpguts.ValidHeaderFieldName); it drops the others.
func validFieldName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
