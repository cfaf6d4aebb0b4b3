package gateway

import (
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestUpstreamTrailers: an upstream's trailers reach the client through
// the gateway, on the forwarded answer and on its replays, however the
// upstream sends them: announced in Trailer or not (Node's res.addTrailers without the header; Go's
// http.TrailerPrefix), after an empty body, after a gzip body the gateway
// asked for and decoded.
func TestUpstreamTrailers(t *testing.T) {
	cases := []struct {
		name   string
		handle func(w http.ResponseWriter)
		body   string
	}{
		{"announced", func(w http.ResponseWriter) {
			w.Header().Set("Trailer", "X-Checksum")
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "created")
			w.Header().Set("X-Checksum", "abc123")
		}, "created"},
		{"unannounced", func(w http.ResponseWriter) {
			// As Node's res.addTrailers sends them without a Trailer field.
			conn, brw, _ := http.NewResponseController(w).Hijack()
			defer conn.Close()
			_, _ = brw.WriteString("HTTP/1.1 201 Created\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n" +
				"7\r\ncreated\r\n0\r\nX-Checksum: abc123\r\n\r\n")
			_ = brw.Flush()
		}, "created"},
		{"empty body", func(w http.ResponseWriter) {
			w.Header().Set("Trailer", "X-Checksum")
			w.WriteHeader(http.StatusCreated)
			w.Header().Set("X-Checksum", "abc123")
		}, ""},
		{"gzip body", func(w http.ResponseWriter) {
			w.Header().Set("Trailer", "X-Checksum")
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusCreated)
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, "created")
			_ = zw.Close()
			w.Header().Set("X-Checksum", "abc123")
		}, "created"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			u := newUpstream(t)
			u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
				c.handle(w)
				return true
			})
			e := startGateway(t, basicConfig, u.URL)
			for i, replayed := range []bool{false, true} {
				req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/orders", strings.NewReader(`{"order":"t2"}`))
				req.Header.Set("Idempotency-Key", "k-trailer-forms")
				req.Header.Set("X-Account-Id", "acme")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated || string(b) != c.body || (resp.Header.Get("Idempotent-Replayed") == "true") != replayed {
					t.Fatalf("response %d: %d %q %v", i, resp.StatusCode, b, resp.Header)
				}
				if got := resp.Trailer.Get("X-Checksum"); got != "abc123" {
					t.Errorf("response %d: trailer X-Checksum %q, want abc123 (header %v, trailer %v)", i, got, resp.Header, resp.Trailer)
				}
			}
			if n := u.count("t2"); n != 1 {
				t.Fatalf("upstream ran %d times", n)
			}
		})
	}
}
