package httpx_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/httpx"
)

// TestStalledRetriedBodyDoesNotHoldRetry: a 503 (Retry-After: 0) whose
// body stalls after its first bytes (a gateway's error page that never
// ends) is retried at once, and the retry's 201 is the answer. The
// Transport drained the 503's body before retrying, which waited for the
// body's end: the call ran out its deadline and ended in "context deadline
// exceeded" (without a deadline it never returned). So did a body that is
// a problem document (a gateway's or the Guard's own 503 shape), which the
// Transport reads to tell an in-flight answer: that read had no bound but
// the context (it has 200 ms now).
func TestStalledRetriedBodyDoesNotHoldRetry(t *testing.T) {
	for _, tc := range []struct{ name, contentType, body string }{
		{"error page", "", "partial error page"},
		{"problem", httpx.ProblemContentType, `{"type":"https://example.com/problems/overloaded",`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			var attempts atomic.Int64
			srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				if attempts.Add(1) > 1 {
					w.WriteHeader(http.StatusCreated)
					return
				}
				if tc.contentType != "" {
					w.Header().Set("Content-Type", tc.contentType)
				}
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = io.WriteString(w, tc.body)
				http.NewResponseController(w).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(func() { close(release) })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("x"))
			resp, err := retryClient(t, httpx.TransportOptions{}).Do(req)
			if err != nil {
				t.Fatalf("after %d attempts: %v; want the retry's 201", attempts.Load(), err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("%d after %d attempts; want the retry's 201", resp.StatusCode, attempts.Load())
			}
		})
	}
}

// countingRT counts the attempts a Transport hands to its base.
type countingRT struct {
	n    atomic.Int64
	base http.RoundTripper
}

func (c *countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}

// TestPermanentErrorsNotRetried: an error the next attempt would meet again
// (a certificate the client does not trust, a URL scheme the base cannot
// speak) is no lost answer: nothing reached a handler, and asking again
// can only fail again. It is returned at once, as Stripe's clients do,
// not after MaxAttempts handshakes and their backoff. So is a request
// net/http refuses to write (a header value with a newline, a URL
// without a host), which was retried MaxAttempts times.
func TestPermanentErrorsNotRetried(t *testing.T) {
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes it refuses
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	plain := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(plain.Close)
	for _, tc := range []struct {
		name, url string
		mod       func(*http.Request) // what net/http refuses to send
	}{
		{"untrusted certificate", tlsSrv.URL + "/orders", nil},
		{"unsupported scheme", "ftp://127.0.0.1/orders", nil},
		{"header value with a newline", tlsSrv.URL + "/orders", func(r *http.Request) { r.Header["X-Note"] = []string{"a\nb"} }},
		{"no host", "http:///orders", nil},
		{"https to a plain-HTTP port", strings.Replace(plain.URL, "http:", "https:", 1), nil},
		{"control character in the URL", plain.URL, func(r *http.Request) { r.URL.Opaque = "/a\x01b" }},
		{"ContentLength with a nil body", plain.URL, func(r *http.Request) { r.Body, r.GetBody, r.ContentLength = nil, nil, 5 }},
		{"body shorter than ContentLength", plain.URL, func(r *http.Request) { r.ContentLength = 10 }},
		{"port out of range", plain.URL, func(r *http.Request) { r.URL = &url.URL{Scheme: "http", Host: "127.0.0.1:99999", Path: "/"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := &http.Transport{} // trusts no test CA
			t.Cleanup(base.CloseIdleConnections)
			c := &countingRT{base: base}
			cl := httpx.NewClient(httpx.TransportOptions{Base: c, BaseDelay: 5 * time.Millisecond})
			req, err := http.NewRequest("POST", tc.url, strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			if tc.mod != nil {
				tc.mod(req)
			}
			resp, err := cl.Do(req)
			if err == nil {
				_ = resp.Body.Close()
				t.Fatal("no error")
			}
			if n := c.n.Load(); n != 1 {
				t.Fatalf("%d attempts for %v; want 1: the same error comes again", n, err)
			}
		})
	}
}
