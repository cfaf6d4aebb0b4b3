package httpx_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/httpx"
)

// TestInvalidRequestNotRetried: the Transport promises that "An
// error that every attempt would meet again ... is returned at once". A
// request net/http refuses to write (a header value with a newline, a URL
// without a host) meets the same error on
// every attempt, before anything reaches a server; it is retried
// MaxAttempts times with backoff all the same.
func TestInvalidRequestNotRetried(t *testing.T) {
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, tc := range []struct {
		name   string
		method string
		url    string
		header []string
	}{
		{"header value with a newline", "POST", srv.URL, []string{"X-Note", "a\nb"}},
		{"no host", "POST", "http:///orders", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			c := &countingRT{base: base}
			cl := httpx.NewClient(httpx.TransportOptions{Base: c, BaseDelay: 5 * time.Millisecond})
			req, err := http.NewRequest(tc.method, tc.url, strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Idempotency-Key", "k1") // keyed: retried whatever the method
			if tc.header != nil {
				req.Header[tc.header[0]] = []string{tc.header[1]}
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
