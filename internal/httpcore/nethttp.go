package httpcore

import (
	"context"
	"net/http"
)

// NetRequest is Request over a *http.Request, as net/http's ServeMux (or
// chi, gorilla/mux) hands it over: Route is r.Pattern. It is one pointer,
// so it becomes a Request without an allocation.
type NetRequest struct{ R *http.Request }

// The methods of Request, read from R.

func (r NetRequest) Method() string                 { return r.R.Method }
func (r NetRequest) Path() string                   { return r.R.URL.Path }
func (r NetRequest) EscapedPath() string            { return r.R.URL.EscapedPath() }
func (r NetRequest) RawQuery() string               { return r.R.URL.RawQuery }
func (r NetRequest) Route() string                  { return r.R.Pattern }
func (r NetRequest) HeaderValues(n string) []string { return r.R.Header[n] }
func (r NetRequest) ContentLength() int64           { return r.R.ContentLength }
func (r NetRequest) Context() context.Context       { return r.R.Context() }
func (r NetRequest) HTTPRequest() *http.Request     { return r.R }

// ReadBody implements Request (ReadHTTPBody).
func (r NetRequest) ReadBody(w http.ResponseWriter, max int64) ([]byte, error) {
	return ReadHTTPBody(w, r.R, max)
}

// ServeHTTP is the net/http binding: next runs once per key, as
// httpx.Guard documents, and writes to the capture.
func (m *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request, next http.Handler) {
	v := NetRequest{r}
	b := m.Begin(w, v)
	switch {
	case b.Pass:
		next.ServeHTTP(w, r)
	case b.Run:
		m.RunCaptured(w, v, b, func(ctx context.Context, c *Capture) { next.ServeHTTP(c, r.WithContext(ctx)) })
	}
}
