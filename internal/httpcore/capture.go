package httpcore

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
)

// Capture is the ResponseWriter the guarded handler writes to. It holds the
// response back until the middleware has stored it (so a client that has
// seen the response and sends the key again gets the replay, not a 409),
// unless the handler flushes or writes more than the stored maximum: from
// then on bytes go to the client as they come. Either way it keeps a copy
// of up to max body bytes for the store.
//
// It implements http.Flusher and Hijacker itself (so it knows when they
// happen) and Unwrap for the rest of http.ResponseController.
type Capture struct {
	w      http.ResponseWriter
	max    int         // body bytes kept for the store
	before http.Header // the header when the handler was called: outer middleware's fields

	status      int
	wroteHeader bool
	header      headerSnapshot // the header at WriteHeader time
	buf         bytes.Buffer   // the body held back, and kept for the store; starts in small
	small       [heldInline]byte
	tooLarge    bool // more than max body bytes: buf is dropped
	sniff       bool // the body was written without a Content-Type: sniffType gives it one
	committed   bool // the status line has gone to the real writer
	hijacked    bool
	bypassed    bool  // the response went out around the capture (SentAround)
	writeErr    error // the first error writing to the client
	written     int64 // body bytes the handler wrote (and the capture took)
	offered     int64 // body bytes the handler asked to write, refused ones too (as net/http counts them)
	declared    int64 // the Content-Length the status went with, -1 for none
	h2          bool  // the request came over HTTP/2 or later

	// Set by CommitResponse, which writes the whole response itself.
	sealed  bool   // the response is complete: later writes are refused
	stored  []byte // the result it committed to the backstop: the middleware stores these bytes
	release bool   // it answered without committing: release the key, store nothing
	// The trailers it committed (fixedTrailers): the response sends
	// these, not the ones the handler may set afterwards, which its
	// replays could not have.
	committedTrailers []snapField
	fixedTrailers     bool
}

// heldInline is how much of a response body the capture holds without
// an allocation of its own: most API responses fit.
const heldInline = 256

// errSealed is what a handler's write gets after CommitResponse answered.
var errSealed = errors.New("httpx: the response was already written by CommitResponse")

func (c *Capture) Header() http.Header { return c.w.Header() }

func (c *Capture) WriteHeader(code int) {
	if c.wroteHeader || c.hijacked || c.sealed {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses (103 Early Hints) go out at once and
		// are not part of the stored result.
		c.w.WriteHeader(code)
		return
	}
	if code < 100 || code > 999 {
		// net/http panics on these; do the same before anything is kept.
		c.w.WriteHeader(code)
	}
	c.wroteHeader = true
	c.status = code
	h := c.w.Header()
	// net/http sniffs the type of a body sent without one (and without a
	// Content-Encoding) from the first bytes it sends with the status,
	// whether the handler wrote the status or not; the capture does the
	// same when the body goes out (sniffType), so the stored response
	// has the type the client got, whatever type outer middleware sets
	// on a replay.
	// A Transfer-Encoding stops it on HTTP/1.1 only: the HTTP/2 server
	// drops the field and sniffs as usual.
	_, typed := h["Content-Type"]
	c.sniff = !typed && (c.h2 || h.Get("Transfer-Encoding") == "") && h.Get("Content-Encoding") == "" && bodyAllowed(code)
	c.declared = declaredLength(h)
	c.header.take(h)
}

// declaredLength is the Content-Length of a response header as net/http
// reads it from a handler's header: its first value, a decimal number
// taken as it is (not trimmed), not negative; -1 for none, or for one
// net/http drops as invalid (and sends the body without).
func declaredLength(h http.Header) int64 {
	vs := h["Content-Length"]
	if len(vs) == 0 {
		return -1
	}
	n, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// bodyAllowed reports whether a response with status may have a body
// (net/http sniffs no type for one that may not).
func bodyAllowed(status int) bool {
	return (status < 100 || status > 199) && status != http.StatusNoContent && status != http.StatusNotModified
}

func (c *Capture) Write(p []byte) (int, error) {
	if c.hijacked {
		return 0, http.ErrHijacked
	}
	if c.sealed {
		return 0, errSealed
	}
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	c.offered += int64(len(p))
	if c.declared >= 0 && c.offered > c.declared && bodyAllowed(c.status) {
		// net/http refuses, whole, a write that would pass the declared
		// length, and every write after it (it counts the refused bytes),
		// and sends what came before: so does the capture, which then
		// holds (and stores) the body the client got.
		return 0, http.ErrContentLength
	}
	c.written += int64(len(p))
	if !c.tooLarge {
		if c.buf.Len()+len(p) > c.max {
			held := c.buf.Bytes()
			wasCommitted := c.committed
			if !wasCommitted {
				c.sniffType(held, p) // held and then p go out now
			}
			c.tooLarge = true
			c.commit()
			c.buf = bytes.Buffer{}
			if !wasCommitted && len(held) > 0 {
				c.send(held)
			}
		} else {
			c.buf.Write(p)
			if !c.committed {
				return len(p), nil
			}
		}
	}
	return c.send(p)
}

// send writes p to the client, remembering the first error.
func (c *Capture) send(p []byte) (int, error) {
	if c.writeErr != nil {
		return 0, c.writeErr
	}
	n, err := c.w.Write(p)
	if err != nil {
		c.writeErr = err
	}
	return n, err
}

// commit sends the status line and the held body (when the handler wrote
// no status, a 200) and switches to writing through.
func (c *Capture) commit() {
	if c.committed {
		return
	}
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	if !c.tooLarge {
		c.sniffType(c.buf.Bytes(), nil)
	}
	c.committed = true
	// The header goes out as it was when the handler wrote its status, as
	// net/http would send it: later changes are not part of the response,
	// except its trailers, which net/http sends from the header as it is
	// when the handler returns. They are put back after the status, so
	// that they go out as trailers only, as they would have. Those named
	// with http.TrailerPrefix are put back before it too: net/http sends
	// them only on a response it knows has trailers when the status goes
	// out (HTTP/1.1 chunked; a small body otherwise gets a Content-Length
	// and loses them), and a replay sends them, from the stored record,
	// with its status. So a trailer the handler set after a small body
	// reaches the client on the first response as on the replay.
	h := c.w.Header()
	var inline [4]snapField
	trailers := c.trailers(h, inline[:0])
	c.header.restore(h)
	for _, f := range trailers {
		if strings.HasPrefix(f.name, http.TrailerPrefix) {
			h[f.name] = f.vals
		}
	}
	c.w.WriteHeader(c.status)
	// From now on the header goes out as trailers only: those of the
	// header as the handler left it, not a trailer of the status's
	// header (restored) that the handler deleted since.
	for _, f := range c.header.fields {
		if !slices.ContainsFunc(trailers, func(t snapField) bool { return t.name == f.name }) && isTrailer(c.header.fields, f.name) {
			delete(h, f.name)
		}
	}
	for _, f := range trailers {
		h[f.name] = f.vals
	}
	if !c.tooLarge && c.buf.Len() > 0 {
		c.send(c.buf.Bytes())
	}
}

// Flush sends what the handler wrote so far (see FlushError).
func (c *Capture) Flush() { _ = c.FlushError() }

// FlushError sends what the handler wrote so far to the client; from then
// on the response streams. It is what http.ResponseController.Flush calls.
func (c *Capture) FlushError() error {
	if c.hijacked {
		return http.ErrHijacked
	}
	c.commit()
	if c.writeErr != nil {
		return c.writeErr
	}
	return http.NewResponseController(c.w).Flush()
}

// Hijack hands the connection to the handler. The response can then never
// be replayed; the middleware stores a marker instead.
func (c *Capture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if c.wroteHeader && !c.committed {
		// What was written before the hijack reaches the client first,
		// as net/http does.
		c.commit()
	}
	conn, rw, err := http.NewResponseController(c.w).Hijack()
	if err == nil {
		c.hijacked = true
		c.buf = bytes.Buffer{}
	}
	return conn, rw, err
}

// SentAround records that the handler's response went to the client
// around the capture, with status (after Gin's HandleContext, an internal
// redirect, the handlers write to Gin's own writer): its body was not
// seen, so the key keeps a marker, and a replay says the response was not
// kept.
func (c *Capture) SentAround(status int) {
	c.wroteHeader, c.committed, c.bypassed, c.status = true, true, true, status
	c.buf = bytes.Buffer{}
}

// Unwrap gives http.ResponseController the writer underneath, for the
// deadlines and full duplex.
func (c *Capture) Unwrap() http.ResponseWriter { return c.w }

// init readies c to capture a response to w, holding up to max body
// bytes; h2 tells a request that came over HTTP/2 or later.
func (c *Capture) init(w http.ResponseWriter, max int, h2 bool) {
	c.w, c.max, c.h2, c.declared = w, max, h2, -1
	if h := w.Header(); len(h) > 0 {
		c.before = h.Clone()
	}
	c.buf = *bytes.NewBuffer(c.small[:0])
}

// sniffType adds to the header of the status line the Content-Type
// net/http would sniff from the first bytes of the body, held and then
// more, when the handler wrote its body without one (sniff). It runs once,
// when the body starts to go out or is stored: net/http sniffs from what
// it buffered before its first write, so the type of a body written in
// pieces is read from them together, not from the first.
func (c *Capture) sniffType(held, more []byte) {
	if !c.sniff {
		return
	}
	first := held
	if len(held) < sniffLen && len(more) > 0 {
		var b [sniffLen]byte
		n := copy(b[:], held)
		n += copy(b[n:], more)
		first = b[:n]
	}
	if len(first) == 0 {
		return // nothing yet: a later write decides, as in net/http
	}
	c.sniff = false
	c.header.fields = append(c.header.fields, snapField{name: "Content-Type", vals: []string{http.DetectContentType(first)}})
}

// sniffLen is how much of a body http.DetectContentType reads.
const sniffLen = 512

// trailers appends to out the trailer fields in h, the response header
// as the handler leaves it: the fields the header it wrote its status
// with declared in Trailer, and those named with http.TrailerPrefix. Each
// keeps its name in h. A response without trailers costs nothing.
func (c *Capture) trailers(h http.Header, out []snapField) []snapField {
	if c.fixedTrailers {
		return append(out, c.committedTrailers...)
	}
	return trailerFields(c.header.fields, h, out)
}

// trailerFields appends to out the trailer fields in h: those the fields
// of declared (a header) declare in Trailer, and those named with
// http.TrailerPrefix.
func trailerFields(declared []snapField, h http.Header, out []snapField) []snapField {
	for _, f := range declared {
		if f.name != "Trailer" {
			continue
		}
		for _, v := range f.vals {
			for name := range strings.SplitSeq(v, ",") {
				name = textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
				if vs, ok := h[name]; ok && name != "" {
					out = append(out, snapField{name: name, vals: vs})
				}
			}
		}
	}
	for k, vs := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			out = append(out, snapField{name: k, vals: vs})
		}
	}
	return out
}

// isTrailer reports whether field name of a response with header fields
// is a trailer: named with http.TrailerPrefix, or declared in Trailer.
func isTrailer(fields []snapField, name string) bool {
	if strings.HasPrefix(name, http.TrailerPrefix) {
		return true
	}
	for _, f := range fields {
		if f.name != "Trailer" {
			continue
		}
		for _, v := range f.vals {
			for d := range strings.SplitSeq(v, ",") {
				if textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(d)) == name {
					return true
				}
			}
		}
	}
	return false
}

// Status is the status the handler wrote, 0 before it wrote one.
func (c *Capture) Status() int { return c.status }

// Written reports whether the handler wrote its status (or took the
// connection).
func (c *Capture) Written() bool { return c.wroteHeader || c.hijacked }

// Result implements Response.
func (c *Capture) Result() Result {
	if !c.wroteHeader && !c.hijacked {
		c.WriteHeader(http.StatusOK)
	}
	if !c.committed {
		c.sniffType(c.buf.Bytes(), nil)
	}
	// The status went with the fields the capture holds, and a type is
	// among them wherever net/http would have sniffed one (sniffType):
	// without one, the response went out with none.
	untyped := !hasValues(c.header.fields, "Content-Type")
	return Result{Status: c.status, Before: c.before, fields: c.header.fields, Body: c.buf.Bytes(),
		TooLarge: c.tooLarge, Hijacked: c.hijacked, Stored: c.stored, Release: c.release, CutShort: c.cutShort(), Bypassed: c.bypassed,
		Untyped: untyped, trailers: c.trailers(c.w.Header(), nil)}
}

// cutShort reports whether the status went out with a Content-Length
// that the body the handler wrote falls short of: net/http then cuts the
// response off (the client reads an unexpected EOF).
func (c *Capture) cutShort() bool {
	if c.hijacked || c.sealed || c.bypassed || !bodyAllowed(c.status) {
		return false
	}
	return c.declared >= 0 && c.written < c.declared
}

// Send implements Response: the held response goes out.
func (c *Capture) Send() {
	if !c.hijacked {
		c.commit()
	}
}

// Abandon implements Response.
func (c *Capture) Abandon() (http.ResponseWriter, bool) {
	if c.committed || c.hijacked {
		return nil, true
	}
	resetHeader(c.w.Header(), c.before)
	return c.w, false
}
