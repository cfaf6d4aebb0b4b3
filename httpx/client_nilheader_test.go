package httpx_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/idemguard/idemguard/httpx"
)

// TestRoundTripNilHeader: a RoundTripper called directly (as
// another client library, a proxy or a wrapper does) with a request whose
// Header is nil. http.Transport answers "http: nil Request.Header"; the
// Transport clones the request (Header.Clone of nil is nil) and then
// req.Header.Set(key) panics with "assignment to entry in nil map",
// taking down the caller's goroutine instead of returning an error (or
// sending the request with its key).
func TestRoundTripNilHeader(t *testing.T) {
	srv, _ := serve(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	u, err := url.Parse(srv.URL + "/orders")
	if err != nil {
		t.Fatal(err)
	}
	tr := httpx.NewTransport(httpx.TransportOptions{Base: base})
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("RoundTrip of a POST with a nil Header panicked: %v; want a response or an error", p)
		}
	}()
	resp, err := tr.RoundTrip(&http.Request{Method: http.MethodPost, URL: u})
	if err == nil {
		_ = resp.Body.Close()
	}
}
