package httpx_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestTrailersReachClient: a handler that declares a trailer and sets it
// after its body (net/http's way), or names one with http.TrailerPrefix,
// sends it through the Guard as it would without it, and a replay sends
// the same trailers. The capture restored the header of the status line
// when it let the response go, and dropped the trailers set after it; the
// stored response kept none.
func TestTrailersReachClient(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", "declared")
		w.Header().Set(http.TrailerPrefix+"X-Late", "undeclared")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	for i, want := range []bool{false, true} {
		req, _ := http.NewRequest("POST", srv.URL+"/o", strings.NewReader("a"))
		req.Header.Set("Idempotency-Key", "t-1")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != "body" || (resp.Header.Get(httpx.ReplayedHeader) == "true") != want {
			t.Fatalf("response %d: %d %q replayed %q", i, resp.StatusCode, b, resp.Header.Get(httpx.ReplayedHeader))
		}
		if got := resp.Header.Get("X-Sum"); got != "" {
			t.Errorf("response %d: trailer X-Sum sent in the header too (%q)", i, got)
		}
		if got := resp.Trailer.Get("X-Sum"); got != "declared" {
			t.Errorf("response %d: trailer X-Sum %q, want %q (trailers %v)", i, got, "declared", resp.Trailer)
		}
		if got := resp.Trailer.Get("X-Late"); got != "undeclared" {
			t.Errorf("response %d: trailer X-Late %q, want %q (trailers %v)", i, got, "undeclared", resp.Trailer)
		}
	}
}
