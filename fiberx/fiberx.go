// Package fiberx makes Fiber v3 handlers idempotent with a guard.Guard:
// Guard is a fiber.Handler, on Fiber's own context (fasthttp, no net/http
// shim), with exactly the semantics of httpx.Guard (the same rules, from
// the same core, configured by the same httpx.Options): the first request
// with an Idempotency-Key runs the handlers after it and their response is
// stored; a repeat gets it back byte for byte with "Idempotent-Replayed:
// true"; a repeat while the first runs gets 409 with Retry-After (or
// waits, with Options.Wait), on this instance or another; the same key
// with another request gets 422; every error is application/problem+json.
//
// Unlike Fiber's own idempotency middleware, keys are claimed atomically
// in Redis across instances, scoped by caller, method and route, and
// fingerprinted; Set-Cookie is never replayed; a completion is written
// even if the client left.
//
// Use it on a route or group, after the middleware that authenticates the
// caller:
//
//	app.Post("/orders", auth, fiberx.Guard(g, fiberx.Options{
//		Tenant: func(c fiber.Ctx) string { s, _ := c.Locals("account").(string); return s },
//	}), createOrder)
//
// The scope of a key is the caller, the method and the route path Fiber
// matched (c.Route().Path), or the request's path as Fiber routes it under
// app.Use or a group's middleware, whose route is only a prefix of the
// path. Fiber builds the whole
// response before sending it, so the response is stored after the
// handlers return and before Fiber sends it; a streamed body
// (SetBodyStreamWriter, SendStreamWriter, SendStream, and SendFile or
// Download, whose file fasthttp sends as a stream) is sent but not kept
// (replays say so), and is written after the claim ended: the handlers'
// context (c.Context(), the lease's) has ended by then, so a stream writer
// must not read with it (a query's rows, an upstream's body), or it stops
// at the first read. An error a
// handler returns is rendered by the app's ErrorHandler inside the guarded
// run, so it is part of the response: a 4xx is stored and replayed, a 5xx
// (and a 408, 429 or 499, which ask for the retry) releases the key; the middleware then returns nil. Fiber's BodyLimit
// (4 MiB by default) answers larger bodies before the guard sees them;
// with StreamRequestBody it does not, and the guard reads the stream up
// to Options.MaxBody (413 past it, 400 for a body cut off).
// A handler that switches protocols (a WebSocket, through fasthttp's
// Hijack, answering 101 or writing its own on the connection) stores
// nothing, as under httpx.Guard, but fasthttp runs the session after the
// handlers returned: the key is released as the session starts, so a
// request with the key during the session runs the handlers again (under
// httpx.Guard it gets a 409 until the session ends). A handler that ends
// with an informational status (c.SendStatus(102)), which fasthttp sends
// as the response, is released too: no final answer to replay.
//
// Inside the guarded handlers, ClaimFrom gives the lease (for Step,
// KeyFor, a SQL backstop commit with Backstop.Commit); so does
// httpx.ClaimFrom(c.Context()). A handler whose effect is a write to the
// backstop's database ends with CommitResponse, which commits the response
// with it (httpx.CommitResponse needs a net/http writer and refuses on
// Fiber): a row committed with Backstop.Commit itself holds the bytes
// committed, not a stored response, so under backstop.Wrap a key Redis
// forgot would be answered 500 (its effect not run again).
package fiberx

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/adaptor"
	"github.com/valyala/fasthttp"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/httpcore"
)

// Options configure Guard: httpx.Options, whose fields mean what they
// mean for httpx.Guard, and a Fiber way to name the caller. The funcs of
// httpx.Options written for net/http (Tenant, Scope, Fingerprint) work
// too: they get the request converted to a *http.Request with copies of
// its own (what they return may be kept) and c.Context() as its context
// (httpx.TenantFromContext and TenantFromJWT read a value middleware put
// there with c.SetContext), which costs an allocation of the whole
// request; prefer Tenant here.
type Options struct {
	httpx.Options
	// Tenant names the caller from the Fiber context, e.g. a value an
	// authentication middleware stored with c.Locals. Set it or
	// Options.Options.Tenant, or SingleCaller: exactly one of them. A
	// request for which it returns "" is answered 401 and nothing is
	// stored.
	Tenant func(c fiber.Ctx) string
}

// Guard returns Fiber middleware that runs the rest of the chain once per
// key, as httpx.Guard does for a net/http handler; the guarantees are
// httpx.Guard's. A request it answers itself (replay, 400, 401, 409, 413,
// 422, 503, or a 500 after a panic) does not go on to the next handlers.
//
// Guard panics, as Fiber does on a programmer's error, when g is nil or
// Options choose none or more than one of Tenant, Options.Tenant and
// SingleCaller.
func Guard(g *guard.Guard, opts Options) fiber.Handler {
	cfg := httpcore.ConfigOf(opts.Options, "fiberx.Guard")
	if t := opts.Tenant; t != nil {
		if cfg.Tenant != nil {
			panic("fiberx.Guard: Options.Tenant and Options.Options.Tenant are both set; choose one")
		}
		cfg.Tenant = func(r httpcore.Request) string { return t(r.(*request).c) }
	}
	max := opts.MaxStoredResponse
	if max <= 0 {
		max = httpx.DefaultMaxStoredResponse
	}
	maxBody := opts.MaxBody
	if maxBody <= 0 {
		maxBody = httpx.DefaultMaxBody
	}
	e := httpcore.New(g, cfg)
	return func(c fiber.Ctx) error { return serve(e, c, max, maxBody) }
}

func serve(e *httpcore.Engine, c fiber.Ctx, max int, maxBody int64) error {
	v := &request{c: c, maxBody: maxBody}
	b := e.Begin(&answer{c: c}, v)
	switch {
	case b.Pass:
		return c.Next()
	case !b.Run:
		return nil // answered
	}
	resp := &response{c: c, max: max, before: header(c)}
	e.RunBuffered(v, b, resp, func(ctx context.Context) {
		prev := c.Context()
		c.SetContext(context.WithValue(ctx, responseKey{}, resp))
		defer c.SetContext(prev)
		if err := c.Next(); err != nil {
			// Render it now, into the response that is stored.
			if herr := c.App().ErrorHandler(c, err); herr != nil {
				_ = c.SendStatus(fiber.StatusInternalServerError)
			}
		}
	})
	return nil
}

// ClaimFrom returns, inside a handler Guard runs, the lease it runs under
// and the request's fingerprint (httpx.ClaimFrom of c.Context()); ok is
// false outside a guarded run.
func ClaimFrom(c fiber.Ctx) (lease guard.Lease, fingerprint string, ok bool) {
	return httpx.ClaimFrom(c.Context())
}

// CommitResponse ends a guarded handler whose business effect is made in
// tx, a transaction on the backstop's database, as httpx.CommitResponse
// does for a net/http handler (its doc says what each outcome answers): it
// commits the response the client is to receive (status, the header
// fields the handlers set that the replay rules keep, body) as the key's
// row with b.Commit, in the stored-response format the middleware keeps in
// Redis, commits tx, and answers with exactly that response; the
// middleware then stores those very bytes. So the client, replays from
// Redis, and replays from PostgreSQL after Redis forgot the key (under
// backstop.Wrap) get the same response. It ends tx in every outcome, and
// answers itself (the key's stored response, 409, 422, 503 or 500) when
// the commit does not go through. Set the response's header fields before
// calling it, and write nothing to the response after it.
//
// Outside a guarded run it commits tx and answers status and body.
func CommitResponse(c fiber.Ctx, tx *sql.Tx, b *backstop.Backstop, status int, body []byte) error {
	r, _ := c.Context().Value(responseKey{}).(*response)
	if r != nil && r.committed {
		if tx != nil {
			_ = tx.Rollback()
		}
		return errors.New("fiberx: CommitResponse called twice; transaction rolled back")
	}
	before := http.Header(nil)
	if r != nil {
		before = r.before
	}
	c.Response().ResetBody() // the response is the one committed
	stored, release, err := httpcore.CommitBuffered(&answer{c: c}, c.Context(), before, strings.Clone(c.Path()), tx, b, status, body)
	if r != nil {
		r.committed, r.stored, r.release = true, stored, release
	}
	return err
}

// responseKey is the context key of a guarded run's response, for
// CommitResponse.
type responseKey struct{}

// request is httpcore.Request over a Fiber context.
type request struct {
	c       fiber.Ctx
	hr      *http.Request // HTTPRequest, converted once
	path    string        // Path, copied once
	maxBody int64         // Options.MaxBody, for a body stream HTTPRequest reads
	// A body stream (StreamRequestBody), once read: readStream.
	streamRead bool
	streamErr  error
}

func (r *request) Method() string { return r.c.Method() }

// Path is the request's path, a copy: Fiber's is a view of a buffer the
// next request overwrites, and the guard logs it (a handler that keeps
// records writes them later).
func (r *request) Path() string {
	if r.path == "" {
		r.path = strings.Clone(r.c.Path())
	}
	return r.path
}
func (r *request) EscapedPath() string { return string(r.c.Request().URI().PathOriginal()) }
func (r *request) RawQuery() string    { return string(r.c.Request().URI().QueryString()) }

// Route is the path of the route Fiber matched when it spans the whole
// request path (as many segments). Under app.Use or a group's middleware
// the route is only a prefix of the path, and Route is then the request's
// escaped path as Fiber matches it: in lower case unless CaseSensitive,
// without a trailing slash unless StrictRouting. A retry at a variant of
// the path that Fiber routes to the same handler (/v1/Orders, /v1/orders/)
// is so under the same scope, and replayed or refused, never run again.
func (r *request) Route() string {
	route := r.c.Route()
	if route != nil && !isUse(route) && (segments(route.Path) == segments(r.c.Path()) || strings.ContainsAny(route.Path, "*+?")) {
		// A wildcard, greedy or optional parameter spans another number
		// of segments than the path: a route's pattern is still the
		// whole path; a middleware's (app.Use's, a group's) is a prefix
		// of it, whatever it holds.
		return route.Path
	}
	p := r.EscapedPath()
	cfg := r.c.App().Config()
	if !cfg.CaseSensitive {
		p = strings.ToLower(p)
	}
	if !cfg.StrictRouting && len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return p
}

// isUse reports whether route is a middleware's (app.Use, a group's Use):
// a prefix of the paths it matches, whatever its pattern. Fiber keeps that
// in Route's unexported use field, read here; a Fiber without it answers
// false.
func isUse(route *fiber.Route) bool {
	f := reflect.ValueOf(route).Elem().FieldByName("use")
	return f.IsValid() && f.Kind() == reflect.Bool && f.Bool()
}

func segments(p string) int { return strings.Count(strings.TrimSuffix(p, "/"), "/") }

// HeaderValues returns the values of the request's header fields named
// name (canonical), whatever case the client spelled the name in: with
// Fiber's DisableHeaderNormalizing, fasthttp keeps names as sent and
// PeekAll matches them exactly, but an HTTP/2 client sends
// "idempotency-key", and header names are case-insensitive (RFC 9110
// section 5.1): two fields whose names differ only in case are two
// values, as net/http sees them.
func (r *request) HeaderValues(name string) []string {
	h := &r.c.Request().Header
	if r.c.App().Config().DisableHeaderNormalizing {
		var vs []string
		for k, v := range h.All() {
			if strings.EqualFold(string(k), name) {
				vs = append(vs, string(v))
			}
		}
		return vs
	}
	all := h.PeekAll(name)
	if len(all) == 0 {
		return nil
	}
	vs := make([]string, len(all))
	for i, v := range all {
		vs[i] = string(v)
	}
	return vs
}

func (r *request) ContentLength() int64 {
	if n := r.c.Request().Header.ContentLength(); n >= 0 {
		return int64(n)
	}
	return -1
}

func (r *request) Context() context.Context { return r.c.Context() }

// ReadBody returns the body as sent (not decompressed): the one
// fasthttp has read already, or, with Fiber's StreamRequestBody, the
// stream fasthttp leaves (a chunked body, or one with a length past the
// 8 KiB it reads ahead) read here up to max and put back for the
// handlers. fasthttp's own read of a stream takes a body cut off as
// whole, and has no bound.
func (r *request) ReadBody(_ http.ResponseWriter, max int64) ([]byte, error) {
	if err := r.readStream(max); err != nil {
		return nil, err
	}
	if body, ok, err := r.parsedForm(); ok {
		return body, err
	}
	body := r.c.BodyRaw()
	if int64(len(body)) > max {
		return nil, &http.MaxBytesError{Limit: max}
	}
	return body, nil
}

// parsedForm returns, for a multipart/form-data body that fasthttp parsed
// as it read it, the form written in one order: its fields by name, then
// its files by name, each name's values in the order sent. fasthttp
// parses such a body of known length (unless Fiber's
// DisablePreParseMultipartForm) and keeps none of its bytes: the body it
// gives back is the form written again in Go's map order, another body
// each time, which fingerprinted so would answer a retry of the same
// request 422. ok is false for any other body. The body's length was
// checked against MaxBody before.
func (r *request) parsedForm() (body []byte, ok bool, err error) {
	req := r.c.Request()
	boundary := string(req.Header.MultipartFormBoundary())
	if r.c.App().Config().DisablePreParseMultipartForm || boundary == "" || req.Header.ContentLength() <= 0 ||
		len(req.Header.Peek(fiber.HeaderContentEncoding)) > 0 || req.IsBodyStream() {
		return nil, false, nil
	}
	form, err := req.MultipartForm()
	if err != nil {
		return nil, true, fmt.Errorf("reading the multipart form: %w", err)
	}
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(boundary); err != nil {
		return nil, true, fmt.Errorf("writing the multipart form: %w", err)
	}
	for _, name := range slices.Sorted(maps.Keys(form.Value)) {
		for _, v := range form.Value[name] {
			if err := w.WriteField(name, v); err != nil {
				return nil, true, fmt.Errorf("writing the multipart form: %w", err)
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(form.File)) {
		for _, fh := range form.File[name] {
			if err := writeFormFile(w, fh); err != nil {
				return nil, true, fmt.Errorf("writing the multipart form: file %q: %w", name, err)
			}
		}
	}
	if err := w.Close(); err != nil {
		return nil, true, fmt.Errorf("writing the multipart form: %w", err)
	}
	return buf.Bytes(), true, nil
}

// writeFormFile writes the part of a form file, header and content, to w.
func writeFormFile(w *multipart.Writer, fh *multipart.FileHeader) error {
	part, err := w.CreatePart(fh.Header) // its fields sorted
	if err != nil {
		return err
	}
	f, err := fh.Open()
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(part, f)
	return err
}

// readStream reads the request's body stream, if it has one, up to max
// bytes, once, and makes what it read the request's body. A body cut
// off, or past max, is dropped (the request has none) and the
// connection is closed after the answer: the rest is not read.
func (r *request) readStream(max int64) error {
	req := r.c.Request()
	if r.streamRead || !req.IsBodyStream() {
		return r.streamErr
	}
	r.streamRead = true
	limit := max // a byte past max, to see it passed; not past the largest int64
	if limit < math.MaxInt64 {
		limit++
	}
	body, err := io.ReadAll(io.LimitReader(req.BodyStream(), limit))
	switch {
	case err != nil:
		r.streamErr = fmt.Errorf("reading the request body: %w", err)
	case int64(len(body)) > max:
		r.streamErr = &http.MaxBytesError{Limit: max}
	case req.Header.ContentLength() > len(body):
		// fasthttp's stream of a body with a Content-Length ends with
		// io.EOF when the connection does, short of that length: the
		// client went away mid-body (net/http says io.ErrUnexpectedEOF).
		r.streamErr = fmt.Errorf("reading the request body: %w after %d of %d bytes",
			io.ErrUnexpectedEOF, len(body), req.Header.ContentLength())
	}
	if r.streamErr != nil {
		req.SetConnectionClose()
		body = nil
	}
	req.SetBody(body) // the stream is done with
	return r.streamErr
}

// HTTPRequest is the request converted for net/http funcs, with the
// Fiber context's context.Context (c.Context()). A body stream is read
// first, as ReadBody reads it (fasthttp's adaptor would read it whole,
// without a bound, and take a body cut off as whole); when it cannot be
// read, the converted request has no body and ReadBody says why.
func (r *request) HTTPRequest() *http.Request {
	if r.hr == nil {
		_ = r.readStream(r.maxBody)
		hr, err := adaptor.ConvertRequest(r.c, true)
		if err != nil {
			// Only for a request fasthttp parsed but net/http would not
			// take; give the funcs what can be had.
			hr = &http.Request{Method: r.Method(), Header: http.Header{}}
		}
		own(hr, &r.c.Request().Header)
		// The context middleware before the guard put values in, as a
		// net/http request's (httpx.TenantFromContext reads it).
		r.hr = hr.WithContext(r.c.Context())
	}
	return r.hr
}

// own gives hr strings and a body of its own: fasthttp's adaptor makes
// them views of fasthttp's buffers, which the next request on the
// connection overwrites, and what the funcs return from them may be kept
// past the request (the guard keeps Scope's, for the route's run times).
// Its header is taken again from fh, with every value of a field sent
// more than once, in order, under its canonical name, as net/http gives
// them: the adaptor keeps only the last, so a Tenant reading the first
// (Header.Get, as Fiber's c.Get does) would name another caller than the
// middleware before it checked.
func own(hr *http.Request, fh *fasthttp.RequestHeader) {
	hr.Method = strings.Clone(hr.Method)
	hr.Proto = strings.Clone(hr.Proto)
	hr.Host = strings.Clone(hr.Host)
	hr.RequestURI = strings.Clone(hr.RequestURI)
	if hr.URL != nil {
		// Its fields are views of the request URI it was parsed from.
		// (It parsed before, so it parses again.)
		u, err := url.ParseRequestURI(hr.RequestURI)
		if err != nil {
			u = &url.URL{Path: strings.Clone(hr.URL.Path)}
		}
		hr.URL = u
	}
	h := make(http.Header, len(hr.Header))
	for k, v := range fh.All() {
		name := textproto.CanonicalMIMEHeaderKey(string(k))
		if name == "Transfer-Encoding" {
			continue // in hr.TransferEncoding, as the adaptor put it
		}
		h[name] = append(h[name], string(v))
	}
	hr.Header = h
	for i, v := range hr.TransferEncoding {
		hr.TransferEncoding[i] = strings.Clone(v)
	}
	if hr.Body != nil && hr.Body != http.NoBody {
		body, _ := io.ReadAll(hr.Body) // a reader over fasthttp's body
		hr.Body = io.NopCloser(bytes.NewReader(body))
	}
}

// header returns the header fields a buffered response goes out with, as
// an http.Header: not Content-Length (fasthttp sets it from the body),
// nor a Content-Type fasthttp does not send (sendsType), nor the fields
// declared as trailers, which fasthttp leaves out of the header and, with
// a body of known length, sends nowhere.
func header(c fiber.Ctx) http.Header {
	h := http.Header{}
	res := c.Response()
	trailers := res.Header.PeekTrailerKeys()
	for k, v := range res.Header.All() {
		name := textproto.CanonicalMIMEHeaderKey(string(k))
		if name == "Content-Length" || name == "Content-Type" && !sendsType(res) ||
			slices.ContainsFunc(trailers, func(t []byte) bool { return strings.EqualFold(string(t), name) }) {
			continue
		}
		h[name] = append(h[name], string(v))
	}
	return h
}

// sendsType reports whether fasthttp sends the Content-Type that
// res.Header.All gives: one the handler set, or its default type, which
// fasthttp sends only with a Content-Length other than 0 (a body, or one
// a HEAD request's answer declares), never for a status without a body
// (1xx, 204, 304) unless the handler set one: a response that goes out
// without one must be replayed without one.
func sendsType(res *fasthttp.Response) bool {
	// ContentType gives the default type unless told not to: told so, on
	// a copy, it gives only a type the handler set.
	var rh fasthttp.ResponseHeader
	res.Header.CopyTo(&rh)
	rh.SetNoDefaultContentType(true)
	if len(rh.ContentType()) > 0 {
		return true
	}
	if st := res.StatusCode(); st >= 100 && st < 200 || st == http.StatusNoContent || st == http.StatusNotModified {
		return res.Header.ContentLength() != 0
	}
	return len(res.Body()) > 0 || res.IsBodyStream()
}

// setHeader makes the response's header fields h, with Content-Length
// left to fasthttp.
func setHeader(c fiber.Ctx, h http.Header) {
	rh := &c.Response().Header
	status := c.Response().StatusCode()
	rh.Reset()
	rh.SetStatusCode(status)
	for k, vs := range h {
		if k == "Content-Length" || strings.HasPrefix(k, http.TrailerPrefix) {
			// A stored trailer (from a net/http handler under the same
			// key): fasthttp would send it as a malformed header field.
			continue
		}
		for _, v := range vs {
			rh.Add(k, v)
		}
	}
	if len(h["Content-Type"]) == 0 {
		rh.SetNoDefaultContentType(true)
	}
}

// response is the core's hold on the response Fiber builds: read once the
// handlers returned, sent by Fiber when the middleware returns.
type response struct {
	c      fiber.Ctx
	max    int
	before http.Header // the fields when the handlers were called: outer middleware's
	// CommitResponse's outcome: the bytes it committed (or the key's
	// row it answered) to store as they are, or a release.
	committed bool
	stored    []byte
	release   bool
}

// Result implements httpcore.Response. A handler that took the
// connection (fasthttp's Hijack: a WebSocket) with fasthttp's status 200,
// set or not, is reported Hijacked with no status, as net/http's is when
// the handler wrote none: the response fasthttp holds may never go out
// (HijackSetNoResponse, for a handler that writes its own 101 on the
// connection), so it is not what the client gets. The core then releases
// the key of a request asking to upgrade, as for a 101, and stores a
// marker for other requests. (A 101, or another status the handler set,
// goes out before the session: it is what the client gets.)
func (r *response) Result() httpcore.Result {
	if r.committed {
		out := httpcore.Result{Before: r.before, Stored: r.stored, Release: r.release}
		if !r.c.IsAbandoned() {
			out.Status = r.c.Response().StatusCode()
		}
		return out
	}
	if r.c.IsAbandoned() {
		// Fiber's timeout middleware, outside the guard, answered the
		// client (its 408) while the handler ran on, in the response the
		// handler writes: neither its status nor its body is the
		// handler's, and the effect may have happened. Not read (the
		// middleware writes it from its own goroutine).
		return httpcore.Result{Abandoned: true, Before: r.before}
	}
	res := r.c.Response()
	out := httpcore.Result{Status: res.StatusCode(), Before: r.before}
	if out.Status == http.StatusOK && r.c.RequestCtx().Hijacked() {
		out.Status, out.Hijacked = 0, true
		return out
	}
	if connClosed(r.c) {
		// The connection was closed under the response (c.Drop, which
		// sends nothing; c.End, which sent it first): what fasthttp
		// holds (its untouched 200, after a Drop) is not known to be
		// what the client got. Kept as a handler that took the
		// connection, with a 500: a marker, not run again, and no
		// success the client may never have had.
		out.Status, out.Hijacked = http.StatusInternalServerError, true
		return out
	}
	if res.IsBodyStream() {
		out.Streamed = true // sent after the answer is stored, not kept
		return out
	}
	out.Header = header(r.c)
	out.Untyped = len(out.Header["Content-Type"]) == 0
	out.Body = res.Body()
	if len(out.Body) > r.max {
		out.TooLarge = true
	}
	return out
}

// Committed implements httpcore.CommittedResponse: the bytes
// CommitResponse committed, which stay the key's answer (and the
// client's) if a handler panics after it.
func (r *response) Committed() []byte {
	if r.committed {
		return r.stored
	}
	return nil
}

// Send implements httpcore.Response: Fiber sends the response when the
// middleware returns.
func (r *response) Send() {}

// Abandon implements httpcore.Response: nothing went out yet; the
// response goes back to what outer middleware set.
func (r *response) Abandon() (http.ResponseWriter, bool) {
	res := r.c.Response()
	res.ResetBody()
	res.SetStatusCode(http.StatusOK)
	setHeader(r.c, r.before)
	return &answer{c: r.c}, false
}

// answer is the http.ResponseWriter the core writes its own answers
// (problems, replays) to: a header map over the response's, applied with
// the status.
type answer struct {
	c fiber.Ctx
	h http.Header
}

func (a *answer) Header() http.Header {
	if a.h == nil {
		a.h = header(a.c)
	}
	return a.h
}

func (a *answer) WriteHeader(code int) {
	a.c.Response().SetStatusCode(code)
	setHeader(a.c, a.Header())
}

func (a *answer) Write(p []byte) (int, error) {
	a.c.Response().AppendBody(p)
	return len(p), nil
}

// connClosed reports whether c's connection was closed while the handlers
// ran (c.Drop, c.End). Setting a read deadline on it is how to ask: it
// fails on a closed connection, and fasthttp sets its own before it reads
// the next request.
func connClosed(c fiber.Ctx) bool {
	conn := c.RequestCtx().Conn()
	if conn == nil {
		return false
	}
	return errors.Is(conn.SetReadDeadline(time.Time{}), net.ErrClosed)
}
