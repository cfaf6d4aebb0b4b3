package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestUpstreamTrailers: an upstream's trailers reach the client through
// the gateway, on the forwarded answer and on its replays.
func TestUpstreamTrailers(t *testing.T) {
	u := newUpstream(t)
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		w.Header().Set("Trailer", "X-Checksum")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
		w.Header().Set("X-Checksum", "abc123")
		return true
	})
	e := startGateway(t, basicConfig, u.URL)
	for i, replayed := range []bool{false, true} {
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"t1"}`))
		req.Header.Set("Idempotency-Key", "k-trailer")
		req.Header.Set("X-Account-Id", "acme")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != "created" || (resp.Header.Get("Idempotent-Replayed") == "true") != replayed {
			t.Fatalf("response %d: %d %q %v", i, resp.StatusCode, b, resp.Header)
		}
		if got := resp.Trailer.Get("X-Checksum"); got != "abc123" {
			t.Errorf("response %d: trailer X-Checksum %q, want abc123 (header %v, trailer %v)", i, got, resp.Header, resp.Trailer)
		}
	}
	if n := u.count("t1"); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}
