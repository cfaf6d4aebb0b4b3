package httpx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// errCorruptResponse: a stored result that decodeResponse cannot read.
var errCorruptResponse = errors.New("httpx: stored response is corrupt")

// responseVersion is the first byte of every stored response.
const responseVersion = 1

// Why a stored response carries no body (the flags byte).
const (
	notKeptTooLarge = 1 << iota // the body was over Options.MaxStoredResponse
	notKeptHijacked             // the handler hijacked the connection
	knownFlags      = notKeptTooLarge | notKeptHijacked
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

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// decodeResponse reads what encodeResponse wrote. Anything else gives an
// error wrapping errCorruptResponse; it never panics and never allocates
// more than a small multiple of len(b).
func decodeResponse(b []byte) (storedResponse, error) {
	bad := func(what string) (storedResponse, error) {
		return storedResponse{}, fmt.Errorf("%w: %s", errCorruptResponse, what)
	}
	if len(b) < 2 {
		return bad("too short")
	}
	if b[0] != responseVersion {
		return bad(fmt.Sprintf("version %d", b[0]))
	}
	r := storedResponse{notKept: b[1]}
	if r.notKept&^knownFlags != 0 {
		return bad(fmt.Sprintf("flags %#x", r.notKept))
	}
	d := decoder{b: b[2:]}
	status, ok := d.uvarint()
	if !ok || status < 100 || status > 999 {
		return bad("status")
	}
	r.status = int(status)
	n, ok := d.uvarint()
	if !ok || n > uint64(len(d.b))/2 { // every field takes at least two bytes
		return bad("field count")
	}
	if n > 0 {
		r.header = make(http.Header, min(n, 64))
	}
	for range n {
		k, ok1 := d.bytes()
		v, ok2 := d.bytes()
		if !ok1 || !ok2 || len(k) == 0 {
			return bad("header field")
		}
		name := string(k)
		r.header[name] = append(r.header[name], string(v))
	}
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
