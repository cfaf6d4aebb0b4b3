package httpx_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// gzipped is compression middleware as the common ones are: it
// compresses the answer when the request accepts gzip.
func gzipped(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			h.ServeHTTP(w, r)
			return
		}
		zw := gzip.NewWriter(w)
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		h.ServeHTTP(gzipWriter{w, zw}, r)
		_ = zw.Close()
	})
}

type gzipWriter struct {
	http.ResponseWriter
	zw *gzip.Writer
}

func (g gzipWriter) Write(p []byte) (int, error) { return g.zw.Write(p) }

// TestGzipOutsideGuard: the README's rule for compression middleware.
// Outside the Guard, it compresses each answer, replays too, for the
// client in front of it: the stored response is the handler's plain one,
// and a retry that does not accept gzip gets it plain. Inside, the
// compressed bytes and their Content-Encoding are the handler's
// response, as the Guard sees it: stored, and replayed as they are to a
// retry whatever its Accept-Encoding (the Guard replays the response,
// it does not re-encode it). The handler runs once either way.
func TestGzipOutsideGuard(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	body := strings.Repeat("charged ", 16)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, body)
	})
	idem := httpx.Guard(e.g, httpx.Options{SingleCaller: true})
	mux := http.NewServeMux()
	mux.Handle("POST /outside", gzipped(idem(h)))
	mux.Handle("POST /inside", idem(gzipped(h)))
	srv, c := serve(t, mux)
	// get sends the request accepting gzip or only identity (either
	// header set by hand: the Transport then decodes nothing) and returns
	// the answer's Content-Encoding and its body decoded.
	get := func(path string, gz bool) (string, string) {
		t.Helper()
		accept := map[bool]string{true: "gzip", false: "identity"}[gz]
		r := do(t, c, "POST", srv.URL+path, "x", with(key("gz"+path), []string{"Accept-Encoding", accept})...)
		if r.status != http.StatusCreated {
			t.Fatalf("%s: %d %q", path, r.status, r.body)
		}
		raw, enc := r.body, r.header.Get("Content-Encoding")
		if enc == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(raw))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			raw, _ = io.ReadAll(zr)
		}
		return enc, string(raw)
	}
	for _, tc := range []struct {
		path     string
		retryEnc string // the Content-Encoding a retry accepting only identity gets
	}{{"/outside", ""}, {"/inside", "gzip"}} {
		before := runs.Load()
		if enc, b := get(tc.path, true); enc != "gzip" || b != body {
			t.Fatalf("%s first: %q %q", tc.path, enc, b)
		}
		if enc, b := get(tc.path, true); enc != "gzip" || b != body {
			t.Fatalf("%s retry accepting gzip: %q %q", tc.path, enc, b)
		}
		if enc, b := get(tc.path, false); enc != tc.retryEnc || b != body {
			t.Fatalf("%s retry accepting only identity: encoding %q %q; want %q", tc.path, enc, b, tc.retryEnc)
		}
		if n := runs.Load() - before; n != 1 {
			t.Fatalf("%s: %d runs, want 1", tc.path, n)
		}
	}
}
