package fiberx_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/compress"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestCompressPlacement pins what README.md says of Fiber's compress and
// the guard, as TestGzipPlacement does for Echo's Gzip. Before the
// guard, it compresses each answer, replays too, for its client: a retry
// accepting only identity gets the stored answer plain. After it, the
// compressed body and its Content-Encoding are the handler's response:
// stored, and replayed to a retry whatever its Accept-Encoding.
func TestCompressPlacement(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	body := strings.Repeat("charged ", 64)
	h := func(c fiber.Ctx) error { runs.Add(1); return c.Status(http.StatusCreated).SendString(body) }
	opts := fiberx.Options{Options: httpx.Options{SingleCaller: true}}
	app := newApp()
	app.Post("/outside", compress.New(), fiberx.Guard(g, opts), h)
	app.Post("/inside", fiberx.Guard(g, opts), compress.New(), h)
	get := func(path string, gz bool) (string, string) {
		t.Helper()
		accept := map[bool]string{true: "gzip", false: "identity"}[gz]
		code, hdr, b := post(t, app, path, "k"+path, "Accept-Encoding", accept)
		if code != http.StatusCreated {
			t.Fatalf("%s: %d %q", path, code, b)
		}
		enc := hdr.Get("Content-Encoding")
		if enc == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader([]byte(b)))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			raw, _ := io.ReadAll(zr)
			b = string(raw)
		}
		return enc, b
	}
	for _, tc := range []struct {
		path     string
		retryEnc string // the Content-Encoding a retry accepting only identity gets
	}{{"/outside", ""}, {"/inside", "gzip"}} {
		before := runs.Load()
		if enc, b := get(tc.path, true); enc != "gzip" || b != body {
			t.Fatalf("%s first: %q %.20q", tc.path, enc, b)
		}
		if enc, b := get(tc.path, true); enc != "gzip" || b != body {
			t.Fatalf("%s retry accepting gzip: %q %.20q", tc.path, enc, b)
		}
		if enc, b := get(tc.path, false); enc != tc.retryEnc || b != body {
			t.Fatalf("%s retry accepting only identity: encoding %q %.20q; want %q", tc.path, enc, b, tc.retryEnc)
		}
		if n := runs.Load() - before; n != 1 {
			t.Fatalf("%s: %d runs, want 1", tc.path, n)
		}
	}
}
