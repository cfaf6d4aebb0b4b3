package httpcore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// errCorruptResponse: a stored result that decodeResponse cannot read.
var errCorruptResponse = errors.New("httpx: stored response is corrupt")

// responseVersion is the first byte of every stored response.
const responseVersion = 1

// Why a stored response carries no body (the flags byte).
const (
	notKeptTooLarge = 1 << iota // the body was over Options.MaxStoredResponse
	notKeptHijacked             // the handler hijacked the connection
	notKeptStreamed             // the body was a stream, sent after the answer was stored (Fiber)
	notKeptCutShort             // the body fell short of its Content-Length: the response was cut off
	notKeptBypassed             // the response went out around the guard (Gin's HandleContext)
	knownFlags      = notKeptTooLarge | notKeptHijacked | notKeptStreamed | notKeptCutShort | notKeptBypassed
)

// storedResponse is what the middleware keeps of a completed request.
type storedResponse struct {
	status  int
	notKept uint8       // non-zero: a marker; header and body are empty
	header  http.Header // the headers to replay, already filtered
	body    []byte
}

// encodeResponse writes r compactly:
//
//	version(1) flags(1) uvarint(status) uvarint(#fields)
//	{uvarint(len) name uvarint(len) value}... uvarint(len) body
//
// A header with several values is written as several fields, in order;
// names are sorted so equal responses encode equally.
func encodeResponse(r storedResponse) []byte {
	size := 2 + 3*binary.MaxVarintLen64 + len(r.body)
	n := 0
	for k, vs := range r.header {
		for _, v := range vs {
			size += len(k) + len(v) + 2*binary.MaxVarintLen64
			n++
		}
	}
	b := make([]byte, 0, size)
	b = append(b, responseVersion, r.notKept)
	b = binary.AppendUvarint(b, uint64(r.status))
	b = binary.AppendUvarint(b, uint64(n))
	names := make([]string, 0, len(r.header))
	for k := range r.header {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range r.header[k] {
			b = appendBytes(b, k)
			b = appendBytes(b, v)
		}
	}
	b = appendBytes(b, string(r.body))
	return b
}

// markEmpty marks the name of a field the handler set to a single empty
// value with emptyMark (encodeHandlerResponse).
func markEmpty(f snapField) snapField {
	if len(f.vals) == 1 && f.vals[0] == "" {
		f.name = emptyMark + f.name
	}
	return f
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encodeHandlerResponse is encodeResponse of the handler's response:
// status, the fields of h (the header when the handler wrote its status)
// that keepField keeps, the trailers that keepTrailer keeps (named with
// http.TrailerPrefix, which a replay sends as trailers), the removals
// that keepRemoval keeps, and body. It writes the same bytes as encoding
// a storedResponse of those fields would, straight from h.
//
// A field the handler set to a single empty value, which net/http sends
// as an empty field, is stored under its name marked with emptyMark, so
// that it is told apart from a field the response went out without,
// where a replay would send one: that one is stored with a single empty
// value under its name, which a replay sends as no field at all
// (responseView.setHeader): a field of outer middleware (in
// before) that the handler removed, and, when untyped says the response
// went out without a Content-Type (the handler flushed before its body,
// set the field to nil, or removed outer middleware's from a response
// without a body), a Content-Type, so that the replay does not get a
// sniffed one or outer middleware's.
func (m *Engine) encodeHandlerResponse(status int, before http.Header, h, trailers []snapField, body []byte, untyped bool) []byte {
	conn := connectionFields(h)
	var inline [16]snapField
	kept := inline[:0]
	size := 2 + 3*binary.MaxVarintLen64 + len(body)
	n := 0
	keep := func(f snapField) {
		kept = append(kept, f)
		for _, v := range f.vals {
			size += len(f.name) + len(v) + 2*binary.MaxVarintLen64
			n++
		}
	}
	for _, f := range h {
		if m.keepField(f.name, f.vals, before, conn) {
			keep(markEmpty(f))
		}
	}
	for k, vs := range before {
		if len(vs) > 0 && m.keepRemoval(k, h, conn) {
			keep(snapField{name: k, vals: removed})
		}
	}
	if untyped && !hasValues(h, "Content-Type") && (len(body) > 0 || len(before["Content-Type"]) > 0) && m.opts.ReplayHeader("Content-Type") {
		keep(snapField{name: "Content-Type", vals: removed})
	}
	for _, f := range trailers {
		name, prefixed := strings.CutPrefix(f.name, http.TrailerPrefix)
		if !m.keepTrailer(name, f.vals, conn) {
			continue
		}
		if !prefixed {
			f.name = http.TrailerPrefix + name
		}
		keep(markEmpty(f))
	}
	slices.SortFunc(kept, func(a, b snapField) int { return strings.Compare(a.name, b.name) })
	b := make([]byte, 0, size)
	b = append(b, responseVersion, 0)
	b = binary.AppendUvarint(b, uint64(status))
	b = binary.AppendUvarint(b, uint64(n))
	for _, f := range kept {
		for _, v := range f.vals {
			b = appendBytes(b, f.name)
			b = appendBytes(b, v)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(body)))
	return append(b, body...)
}

// decodeResponse reads what encodeResponse wrote. Anything else gives an
// error wrapping errCorruptResponse; it never panics and never allocates
// more than a small multiple of len(b).
func decodeResponse(b []byte) (storedResponse, error) {
	v, err := parseResponse(b)
	if err != nil {
		return storedResponse{}, err
	}
	return storedResponse{status: v.status, notKept: v.notKept, header: v.header(), body: v.body}, nil
}

// responseView is a stored response that parseResponse checked, its
// header fields still encoded: a replay writes them to the response
// without building a map first.
type responseView struct {
	status  int
	notKept uint8
	n       int    // header fields
	fields  []byte // the n fields, encoded
	grouped bool   // each name's values follow one another (encodeResponse sorts names)
	body    []byte
}

// parseResponse checks b as decodeResponse does and returns its parts,
// without allocating unless b is corrupt.
func parseResponse(b []byte) (responseView, error) {
	bad := func(what string) (responseView, error) {
		return responseView{}, fmt.Errorf("%w: %s", errCorruptResponse, what)
	}
	if len(b) < 2 {
		return bad("too short")
	}
	if b[0] != responseVersion {
		return bad(fmt.Sprintf("version %d", b[0]))
	}
	r := responseView{notKept: b[1], grouped: true}
	if r.notKept&^knownFlags != 0 {
		return bad(fmt.Sprintf("flags %#x", r.notKept))
	}
	d := decoder{b: b[2:]}
	status, ok := d.uvarint()
	if !ok || status < 200 || status > 999 { // no 1xx is stored: a 101 releases the key
		return bad("status")
	}
	r.status = int(status)
	n, ok := d.uvarint()
	if !ok || n > uint64(len(d.b))/2 { // every field takes at least two bytes
		return bad("field count")
	}
	r.n = int(n)
	fields := d.b
	var prev []byte
	for range n {
		k, ok1 := d.bytes()
		_, ok2 := d.bytes()
		if !ok1 || !ok2 || len(k) == 0 {
			return bad("header field")
		}
		if bytes.Compare(k, prev) < 0 {
			r.grouped = false
		}
		prev = k
	}
	r.fields = fields[:len(fields)-len(d.b)]
	body, ok := d.bytes()
	if !ok || len(d.b) != 0 {
		return bad("body")
	}
	if r.notKept != 0 && (len(body) != 0 || n != 0) {
		return bad("marker with content")
	}
	r.body = body
	return r, nil
}

// header returns the fields as a header, or nil when there are none.
func (v responseView) header() http.Header {
	if v.n == 0 {
		return nil
	}
	h := make(http.Header, min(v.n, 64))
	d := decoder{b: v.fields}
	for range v.n {
		k, _ := d.bytes()
		val, _ := d.bytes()
		name := string(k)
		h[name] = append(h[name], string(val))
	}
	return h
}

// emptyMark starts the stored name of a field the handler set to a single
// empty value (encodeHandlerResponse). No field the handler sets starts
// with it: it is not allowed in a field name (net/http sends no such
// field, and keepField and keepTrailer store none).
const emptyMark = "\x00"

// setHeader sets the fields in h, each name's values replacing h's, and
// Idempotent-Replayed: true: two allocations, one string that holds
// every name and value and one slice of the values. A field stored with
// a single empty value is one the response went out without
// (encodeHandlerResponse): it is set to nil, which net/http sends as no
// field, and which for Content-Type keeps it from sniffing one. A field
// stored under a name marked with emptyMark is set, unmarked, to its
// single empty value, which net/http sends as an empty field.
func (v responseView) setHeader(h http.Header) {
	if v.n == 0 || !v.grouped {
		for k, vs := range v.header() {
			if name, ok := strings.CutPrefix(k, emptyMark); ok {
				h[name] = vs
				continue
			}
			if len(vs) == 1 && vs[0] == "" {
				vs = nil
			}
			h[k] = vs
		}
		h.Set(ReplayedHeader, "true")
		return
	}
	all := string(v.fields)
	vals := make([]string, v.n+1)
	d := decoder{b: v.fields}
	at := func() int { return len(v.fields) - len(d.b) } // offset in all
	first, name := 0, ""
	for i := range v.n {
		k, _ := d.bytes()
		k2 := all[at()-len(k) : at()]
		val, _ := d.bytes()
		vals[i] = all[at()-len(val) : at()]
		if i == 0 || k2 != name {
			first, name = i, k2
		}
		if marked, ok := strings.CutPrefix(name, emptyMark); ok {
			h[marked] = vals[first : i+1 : i+1]
			continue
		}
		h[name] = vals[first : i+1 : i+1]
		if i == first && vals[i] == "" {
			h[name] = nil // removed; a second value of the name sets it again
		}
	}
	vals[v.n] = "true"
	h[ReplayedHeader] = vals[v.n:]
}

type decoder struct{ b []byte }

func (d *decoder) uvarint() (uint64, bool) {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		return 0, false
	}
	d.b = d.b[n:]
	return v, true
}

func (d *decoder) bytes() ([]byte, bool) {
	n, ok := d.uvarint()
	if !ok || n > uint64(len(d.b)) {
		return nil, false
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v, true
}
