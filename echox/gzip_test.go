package echox_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemguard/idemguard/echox"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestGzipPlacement pins what README.md says of compression middleware
// and the guard. Outside the guard, Echo's Gzip compresses each answer
// for its client: the stored response is the handler's plain one, a
// retry that accepts gzip gets it compressed and one that does not gets
// it plain. Inside, the compressed bytes and their Content-Encoding are
// the handler's response: stored, and replayed to a retry whatever its
// Accept-Encoding.
func TestGzipPlacement(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	body := strings.Repeat("charged ", 16)
	h := func(c echo.Context) error { runs.Add(1); return c.String(http.StatusCreated, body) }
	gz := middleware.GzipWithConfig(middleware.GzipConfig{MinLength: 1})
	opts := echox.Options{Options: httpx.Options{SingleCaller: true}}
	e := newEcho()
	e.POST("/outside", h, gz, echox.Guard(g, opts))
	e.POST("/inside", h, echox.Guard(g, opts), gz)
	plain := func(path string, gzipped bool) (string, string) {
		t.Helper()
		var accept []string
		if gzipped {
			accept = []string{"Accept-Encoding", "gzip"}
		}
		w := post(t, e, path, "k"+path, accept...)
		raw := w.Body.Bytes()
		enc := w.Header().Get("Content-Encoding")
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
		retryEnc string // the Content-Encoding a retry without Accept-Encoding gets
	}{{"/outside", ""}, {"/inside", "gzip"}} {
		before := runs.Load()
		if enc, b := plain(tc.path, true); enc != "gzip" || b != body {
			t.Fatalf("%s first: %q %q", tc.path, enc, b)
		}
		if enc, b := plain(tc.path, true); enc != "gzip" || b != body {
			t.Fatalf("%s retry accepting gzip: %q %q", tc.path, enc, b)
		}
		if enc, b := plain(tc.path, false); enc != tc.retryEnc || b != body {
			t.Fatalf("%s retry not accepting gzip: encoding %q %q; want %q", tc.path, enc, b, tc.retryEnc)
		}
		if n := runs.Load() - before; n != 1 {
			t.Fatalf("%s: %d runs, want 1", tc.path, n)
		}
	}
}
