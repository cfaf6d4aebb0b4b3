// Package echox makes Echo handlers idempotent with a guard.Guard: Guard
// is an echo.MiddlewareFunc with exactly the semantics of httpx.Guard (the
// same rules, from the same core, configured by the same httpx.Options):
// the first request with an Idempotency-Key runs the handler and its
// response is stored; a repeat gets it back byte for byte with
// "Idempotent-Replayed: true"; a repeat while the first runs gets 409
// with Retry-After (or waits, with Options.Wait); the same key with
// another request gets 422; every error is application/problem+json.
//
// Use it as route or group middleware, after the middleware that
// authenticates the caller:
//
//	orders := e.Group("/orders", auth, echox.Guard(g, echox.Options{
//		Tenant: func(c echo.Context) string { s, _ := c.Get("account").(string); return s },
//	}))
//
// The scope of a key is the caller, the method and the route pattern Echo
// matched (c.Path(), after the host under Echo's host routing, e.Host).
// An error the handler returns is rendered by Echo's HTTPErrorHandler
// inside the guarded run (c.Error), so it is part of the response: a 4xx
// is stored and replayed, a 5xx (and a 408, 429 or 499, which ask for the
// retry) releases the key; the middleware then returns nil, so middleware
// outside the guard does not see the error (put ContextTimeout, or any
// error-mapping middleware, after it; and not Echo's deprecated Timeout
// before it, which hands the request's Context to the next request while
// the handler still runs). The handler
// writes to an echo.Response of its own: the fields a Before hook it
// registers sets are its response's (stored and replayed); the hooks of
// middleware outside the guard run when the response goes out, on a
// replay too, and what they set is not stored, as for middleware wrapping
// httpx.Guard. Inside the handler, ClaimFrom gives the lease (for Step,
// KeyFor, a SQL backstop commit); so does
// httpx.ClaimFrom(c.Request().Context()).
package echox

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/httpcore"
)

// Options configure Guard: httpx.Options, whose fields mean what they
// mean for httpx.Guard (its funcs Tenant, Scope and Fingerprint get
// c.Request()), and an Echo way to name the caller.
type Options struct {
	httpx.Options
	// Tenant names the caller from the Echo context, e.g. a value an
	// authentication middleware stored with c.Set. Set it or
	// Options.Options.Tenant (a func of the *http.Request), or
	// SingleCaller: exactly one of them. A request for which it returns
	// "" is answered 401 and nothing is stored.
	Tenant func(c echo.Context) string
}

// Guard returns Echo middleware that runs the handler once per key, as
// httpx.Guard does for a net/http handler; the guarantees are
// httpx.Guard's.
//
// Guard panics, as Echo does on a programmer's error, when g is nil or
// Options choose none or more than one of Tenant, Options.Tenant and
// SingleCaller.
func Guard(g *guard.Guard, opts Options) echo.MiddlewareFunc {
	cfg := httpcore.ConfigOf(opts.Options, "echox.Guard")
	if t := opts.Tenant; t != nil {
		if cfg.Tenant != nil {
			panic("echox.Guard: Options.Tenant and Options.Options.Tenant are both set; choose one")
		}
		cfg.Tenant = func(r httpcore.Request) string { return t(r.(request).c) }
	}
	e := httpcore.New(g, cfg)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error { return serve(e, c, next) }
	}
}

func serve(e *httpcore.Engine, c echo.Context, next echo.HandlerFunc) error {
	v := request{c}
	res := c.Response()
	b := e.Begin(res, v)
	switch {
	case b.Pass:
		return next(c)
	case !b.Run:
		return nil // answered
	}
	req := c.Request()
	e.RunCaptured(sent{res}, v, b, func(ctx context.Context, capture *httpcore.Capture) {
		// The handler writes to a Response of its own over the capture:
		// its Before and After hooks are the handler's (stored), those
		// outer middleware registered on res run when the response goes
		// out, as an outer wrapper's around httpx.Guard.
		inner := echo.NewResponse(capture, c.Echo())
		inner.Status = http.StatusOK // as Echo resets a request's Response
		c.SetResponse(inner)
		c.SetRequest(req.WithContext(ctx))
		defer func() { c.SetResponse(res); c.SetRequest(req) }()
		if err := next(c); err != nil {
			c.Error(err) // Echo renders it now, into the captured response
		}
	})
	return nil
}

// ClaimFrom returns, inside a handler Guard runs, the lease it runs under
// and the request's fingerprint (httpx.ClaimFrom); ok is false outside a
// guarded run.
func ClaimFrom(c echo.Context) (lease guard.Lease, fingerprint string, ok bool) {
	return httpx.ClaimFrom(c.Request().Context())
}

// request is httpcore.Request over an Echo context.
type request struct{ c echo.Context }

func (r request) Method() string      { return r.c.Request().Method }
func (r request) Path() string        { return r.c.Request().URL.Path }
func (r request) EscapedPath() string { return r.c.Request().URL.EscapedPath() }
func (r request) RawQuery() string    { return r.c.Request().URL.RawQuery }

// Route is the path of the route Echo matched (c.Path()), after the host
// whose router matched it when Echo routes by host (e.Host): each host has
// a router of its own, whose paths are another host's too, so the same
// path under two hosts is two routes ("a.example/charges", as a net/http
// ServeMux pattern with a host); before routing (e.Pre), the host and the
// escaped path, as the scope of a request without a route is its path. A
// request for no such host is routed by the default router, and its route
// is the path alone.
func (r request) Route() string {
	path := r.c.Path()
	if routers := r.c.Echo().Routers(); len(routers) > 0 {
		host := r.c.Request().Host
		if _, ok := routers[host]; ok {
			if path == "" {
				path = r.EscapedPath()
			}
			return host + path
		}
	}
	return path
}

func (r request) HeaderValues(n string) []string { return r.c.Request().Header[n] }
func (r request) ContentLength() int64           { return r.c.Request().ContentLength }
func (r request) Context() context.Context       { return r.c.Request().Context() }
func (r request) HTTPRequest() *http.Request     { return r.c.Request() }
func (r request) ReadBody(w http.ResponseWriter, max int64) ([]byte, error) {
	body, err := httpcore.ReadHTTPBody(w, r.c.Request(), max)
	if he, ok := errors.AsType[*echo.HTTPError](err); ok && he.Code == http.StatusRequestEntityTooLarge {
		// BodyLimit before the guard stopped a chunked body: 413, not 400.
		err = fmt.Errorf("%w (%w)", httpcore.ErrBodyTooLarge, err)
	}
	return body, err
}

// sent is the writer the capture sends the response to (or the core its
// 500 after a panic): Echo's Response of the request, so that outer
// middleware's Before and After hooks run as it goes out and its Status,
// Size and Committed say what went out; except an informational status
// (103 Early Hints), which goes to the writer under it at once: Response
// would take it for the final one.
type sent struct{ *echo.Response }

func (s sent) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		s.Response.Writer.WriteHeader(code)
		return
	}
	s.Response.WriteHeader(code)
}
