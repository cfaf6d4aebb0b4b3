package gateway

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// The gateway asks the upstream for gzip itself on a guarded request (the
// client's Accept-Encoding is not forwarded: the stored answer must be one
// every retry can read) and decodes the answer itself, rather than leaving
// both to the Transport, so that an answer labelled gzip whose body does
// not decode is still the upstream's answer: its effect happened and its
// status says how it went. Such an answer is kept as it came (status,
// headers, Content-Encoding included, the bytes as sent), for the first
// caller and every retry alike, like a proxy that never decodes; it is no
// unknown outcome, and the request is never sent again.

// errTooLongToKeep: a body labelled gzip broke off decoding after more
// bytes than the gateway keeps to fall back on.
var errTooLongToKeep = errors.New("gateway: the upstream's gzip answer does not decode, and too much of it was read to pass it on as it came")

// asksGzip reports whether the gateway asks for gzip on out (as the
// Transport would: not for HEAD, nor for a range, which decodes to
// nothing useful).
func asksGzip(out *http.Request) bool {
	return out.Method != http.MethodHead && out.Header.Get("Range") == ""
}

// recorder keeps the bytes read through it, up to max, while on.
type recorder struct {
	r        io.Reader
	buf      []byte
	max      int
	on       bool
	overflow bool
	err      error // the last error of r
}

func (c *recorder) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if c.on {
		if len(c.buf)+n > c.max {
			c.overflow, c.on, c.buf = true, false, nil
		} else {
			c.buf = append(c.buf, p[:n]...)
		}
	}
	if err != nil {
		c.err = err
	}
	return n, err
}

// readHeld reads up to limit+1 bytes of res's body, decoded when the
// gateway asked for gzip (asked) and the upstream used it, and returns
// them with what follows them. A gzip answer that decodes loses its
// Content-Encoding and Content-Length; one that does not is read as it
// came (undecodable reports that). err is a failure to read the body
// from the upstream.
func readHeld(res *http.Response, asked bool, limit int64) (held []byte, rest io.Reader, undecodable error, err error) {
	if asked && strings.EqualFold(res.Header.Get("Content-Encoding"), "gzip") {
		rec := &recorder{r: res.Body, max: int(limit) + 1 + 64<<10, on: true}
		zr, derr := gzip.NewReader(rec)
		began := derr == nil // a gzip header: the body is gzip
		switch {
		case derr == nil:
			held, derr = io.ReadAll(io.LimitReader(zr, limit+1))
			rest = zr
		case derr == io.EOF: // an empty body, as the Transport reads it
			held, derr, rest = nil, nil, http.NoBody
		}
		if rec.err != nil && rec.err != io.EOF {
			return nil, nil, nil, rec.err // the connection broke, not the coding
		}
		if began && errors.Is(derr, io.ErrUnexpectedEOF) && closeDelimited(res) {
			// A body that ends with the connection (no length, not
			// chunked) has no framing to say it was cut: the gzip stream
			// does, which began and then ended before its end. The
			// connection broke (the upstream died while it wrote), as a
			// framed body's short read would say.
			return nil, nil, nil, fmt.Errorf("the gzip answer ended with the connection before its end: %w", derr)
		}
		if derr == nil {
			rec.on, rec.buf = false, nil
			res.Header.Del("Content-Encoding")
			res.Header.Del("Content-Length")
			res.ContentLength, res.Uncompressed = -1, true
			return held, rest, nil, nil
		}
		if rec.overflow {
			return nil, nil, nil, fmt.Errorf("%w: %w", errTooLongToKeep, derr)
		}
		undecodable = derr
		res.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(rec.buf), res.Body), res.Body}
	}
	held, err = io.ReadAll(io.LimitReader(res.Body, limit+1))
	return held, res.Body, undecodable, err
}

// closeDelimited reports whether res's body ends when the connection does
// (HTTP/1.0, or no Content-Length and not chunked): a cut there reads as
// a clean end.
func closeDelimited(res *http.Response) bool {
	return res.ContentLength < 0 && len(res.TransferEncoding) == 0
}
