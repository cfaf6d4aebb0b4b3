// Package ginx makes Gin handlers idempotent with a guard.Guard: Guard is
// a gin.HandlerFunc with exactly the semantics of httpx.Guard (the same
// rules, from the same core, configured by the same httpx.Options): the
// first request with an Idempotency-Key runs the handlers after it and
// their response is stored; a repeat gets it back byte for byte with
// "Idempotent-Replayed: true"; a repeat while the first runs gets 409
// with Retry-After (or waits, with Options.Wait); the same key with
// another request gets 422; every error is application/problem+json.
//
// Use it as route or group middleware, after the middleware that
// authenticates the caller:
//
//	orders := r.Group("/orders", auth, ginx.Guard(g, ginx.Options{
//		Tenant: func(c *gin.Context) string { return c.GetString("account") },
//	}))
//
// The scope of a key is the caller, the method and the route pattern Gin
// matched (c.FullPath()). Inside the guarded handlers, ClaimFrom gives the
// lease (for Step, KeyFor, a SQL backstop commit); so does
// httpx.ClaimFrom(c.Request.Context()).
package ginx

import (
	"bufio"
	"context"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/httpcore"
)

// Options configure Guard: httpx.Options, whose fields mean what they
// mean for httpx.Guard (its funcs Tenant, Scope and Fingerprint get
// c.Request), and a Gin way to name the caller.
type Options struct {
	httpx.Options
	// Tenant names the caller from the Gin context, e.g. a value an
	// authentication middleware stored with c.Set. Set it or
	// Options.Options.Tenant (a func of the *http.Request), or
	// SingleCaller: exactly one of them. A request for which it returns
	// "" is answered 401 and nothing is stored.
	Tenant func(c *gin.Context) string
}

// Guard returns Gin middleware that runs the rest of the chain once per
// key, as httpx.Guard does for a net/http handler; the guarantees are
// httpx.Guard's. A request it answers itself (replay, 400, 401, 409, 413,
// 422, 503, or a 500 after a panic) is aborted: the handlers after it do
// not run. A guarded run whose handlers reported errors (c.Error; not
// those middleware before the guard reported) and set no status is
// answered 500 and its key released: middleware outside
// the guard that renders c.Errors writes after the run, over that 500,
// and what it writes is not stored.
//
// Guard panics, as Gin does on a programmer's error, when g is nil or
// Options choose none or more than one of Tenant, Options.Tenant and
// SingleCaller.
func Guard(g *guard.Guard, opts Options) gin.HandlerFunc {
	cfg := httpcore.ConfigOf(opts.Options, "ginx.Guard")
	if t := opts.Tenant; t != nil {
		if cfg.Tenant != nil {
			panic("ginx.Guard: Options.Tenant and Options.Options.Tenant are both set; choose one")
		}
		cfg.Tenant = func(r httpcore.Request) string { return t(r.(request).c) }
	}
	e := httpcore.New(g, cfg)
	return func(c *gin.Context) { serve(e, c) }
}

func serve(e *httpcore.Engine, c *gin.Context) {
	v := request{c}
	b := e.Begin(c.Writer, v)
	switch {
	case b.Pass:
		c.Next()
		return
	case !b.Run:
		c.Abort() // answered
		return
	}
	orig, req := c.Writer, c.Request
	reported := len(c.Errors) // middleware before the guard's: not the run's
	e.RunCaptured(out{orig}, v, b, func(ctx context.Context, capture *httpcore.Capture) {
		w := &writer{c: capture, orig: orig, status: orig.Status(), size: -1}
		c.Writer, c.Request = w, req.WithContext(ctx)
		defer func() { c.Writer, c.Request = orig, req }()
		c.Next()
		if c.Writer != w && !w.Written() && c.Writer.Written() {
			// Gin's HandleContext (an internal redirect) reset c.Writer to
			// Gin's own, and the response went out around the capture
			// (Gin writes its header when the redirect's handlers end). A
			// middleware's wrapper of w (a body logger) writes through w.
			capture.SentAround(c.Writer.Status())
			return
		}
		if !w.Written() && !w.chosen && len(c.Errors) > reported {
			// The handlers reported an error (c.Error) and answered
			// nothing, not even a status: a middleware outside the
			// guard renders c.Errors after it returns, or nothing does.
			// Not an answer to store (a 200 without a body, replayed to
			// the retry of a failed request): 500 releases the key, and
			// the middleware then writes over it, as Gin holds a status
			// until the body. (A handler whose c.JSON failed after its
			// effect chose its status: that is stored.)
			w.status = http.StatusInternalServerError
		}
		w.WriteHeaderNow() // a status set without a body (c.Status(204)), as Gin sends it
	})
	c.Abort() // the chain ran inside; after a panic, nothing more runs
}

// out is the writer the core sends the guarded response to: Gin's own,
// except that an informational response (103 Early Hints; not a 101)
// goes to net/http's writer under it at once, as net/http sends it. Gin's
// writer only records a status until a body, so a 1xx written to it
// was never sent, and the final status replaced it.
type out struct{ gin.ResponseWriter }

func (o out) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		if u, ok := o.ResponseWriter.(interface{ Unwrap() http.ResponseWriter }); ok {
			u.Unwrap().WriteHeader(code)
			return
		}
	}
	o.ResponseWriter.WriteHeader(code)
}

// Unwrap gives http.ResponseController Gin's writer.
func (o out) Unwrap() http.ResponseWriter { return o.ResponseWriter }

// ClaimFrom returns, inside a handler Guard runs, the lease it runs under
// and the request's fingerprint (httpx.ClaimFrom); ok is false outside a
// guarded run.
func ClaimFrom(c *gin.Context) (lease guard.Lease, fingerprint string, ok bool) {
	return httpx.ClaimFrom(c.Request.Context())
}

// request is httpcore.Request over a Gin context.
type request struct{ c *gin.Context }

func (r request) Method() string                 { return r.c.Request.Method }
func (r request) Path() string                   { return r.c.Request.URL.Path }
func (r request) EscapedPath() string            { return r.c.Request.URL.EscapedPath() }
func (r request) RawQuery() string               { return r.c.Request.URL.RawQuery }
func (r request) Route() string                  { return r.c.FullPath() }
func (r request) HeaderValues(n string) []string { return r.c.Request.Header[n] }
func (r request) ContentLength() int64           { return r.c.Request.ContentLength }
func (r request) Context() context.Context       { return r.c.Request.Context() }
func (r request) HTTPRequest() *http.Request     { return r.c.Request }
func (r request) ReadBody(w http.ResponseWriter, max int64) ([]byte, error) {
	return httpcore.ReadHTTPBody(w, r.c.Request, max)
}

// writer is the gin.ResponseWriter the guarded handlers write to: Gin's
// own semantics (the status is held until the body or WriteHeaderNow, so
// header fields set after c.Status still go out) over the core's capture.
type writer struct {
	c      *httpcore.Capture
	orig   gin.ResponseWriter
	status int
	size   int  // -1 until the header is written
	chosen bool // a handler set a status (c.Status, WriteHeader)
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) Header() http.Header { return w.c.Header() }

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status, w.chosen = code, true
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.c.WriteHeader(w.status)
	}
}

func (w *writer) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.c.Write(p)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }
func (w *writer) Status() int                       { return w.status }
func (w *writer) Size() int                         { return w.size }
func (w *writer) Written() bool                     { return w.size != -1 }
func (w *writer) Pusher() http.Pusher               { return nil }

// Flush sends what the handler wrote so far; the response then streams.
func (w *writer) Flush() {
	w.WriteHeaderNow()
	w.c.Flush()
}

// Hijack hands the connection over; the key keeps a marker (or, for a
// protocol switch, is released). A status written before (a 101, then the
// connection taken: coder/websocket) goes out first, as net/http sends
// it: Gin's own writer, under the capture, holds a status until a body or
// a flush, and its Hijack sends none.
func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.Written() {
		w.c.Flush()
	}
	if w.size < 0 {
		w.size = 0
	}
	return w.c.Hijack()
}

// CloseNotify is Gin's writer's.
func (w *writer) CloseNotify() <-chan bool { return w.orig.CloseNotify() }

// Unwrap gives http.ResponseController the capture.
func (w *writer) Unwrap() http.ResponseWriter { return w.c }
