package gateway

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
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

// TestRequestTrailersNotFingerprinted: a request's trailers are not part
// of its fingerprint (httpx.DefaultFingerprint: method, path and query,
// Content-Type, body). A retry that differs from the first request only in
// its trailers is the same request: it is replayed the first one's
// answer, and the upstream saw the first one's trailers only. A retry
// with another body is still refused (422).
func TestRequestTrailersNotFingerprinted(t *testing.T) {
	u := newUpstream(t)
	var mu sync.Mutex
	var seen []string // the X-Checksum trailer of each request the upstream got
	u.setHandle(func(w http.ResponseWriter, r *http.Request, _ string) bool {
		mu.Lock()
		seen = append(seen, r.Trailer.Get("X-Checksum"))
		mu.Unlock()
		return false
	})
	e := startGateway(t, basicConfig, u.URL)
	send := func(body, checksum string) *http.Response {
		t.Helper()
		c, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_, err = fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"+
			"Idempotency-Key: k-req-trailer\r\nX-Account-Id: acme\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"+
			"%x\r\n%s\r\n0\r\nX-Checksum: %s\r\n\r\n", len(body), body, checksum)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(res.Body)
		res.Body.Close()
		return res
	}
	if res := send(`{"order":"rt1"}`, "first"); res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first request: %d %v", res.StatusCode, res.Header)
	}
	if res := send(`{"order":"rt1"}`, "second"); res.StatusCode != http.StatusCreated || res.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry with other trailers: %d %v; want the first one's answer replayed", res.StatusCode, res.Header)
	}
	if res := send(`{"order":"rt2"}`, "first"); res.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("the key with another body: %d; want 422", res.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || seen[0] != "first" {
		t.Fatalf("the upstream got trailers %q; want the first request's alone, [first]", seen)
	}
}
