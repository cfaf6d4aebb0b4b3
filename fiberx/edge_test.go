package fiberx_test

// What fasthttp sends that is not a plain status, header and body: a
// replay is what the first caller got.

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestInformationalFinalStatus: a Fiber handler that ends with an
// informational status (c.SendStatus(fiber.StatusProcessing), c.Status(100))
// has fasthttp send it as the response: no final answer a replay could
// repeat, nor one the stored format keeps ("no 1xx is stored"). The key is
// released, as for a 101 (it was stored, and every retry got 500 "stored
// response unreadable" for the whole TTL).
func TestInformationalFinalStatus(t *testing.T) {
	for _, status := range []int{http.StatusContinue, http.StatusProcessing, http.StatusEarlyHints} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			g := guardenv.Guard(t, guard.Options{})
			var runs atomic.Int64
			app := newApp()
			app.Post("/jobs", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
				runs.Add(1)
				return c.SendStatus(status)
			})
			first, _, _ := post(t, app, "/jobs", "inf-1")
			if first != status {
				t.Fatalf("first: %d, want %d (what fasthttp sends)", first, status)
			}
			code, h, body := post(t, app, "/jobs", "inf-1")
			if code == http.StatusInternalServerError || strings.Contains(body, httpx.ProblemCorruptResponse) {
				t.Fatalf("retry: %d %s (Idempotent-Replayed %q, %d runs); the guard stored a record it cannot read: "+
					"want a readable answer (the run released, as a 101, or stored as a final status), not 500 for the TTL",
					code, body, h.Get(httpx.ReplayedHeader), runs.Load())
			}
			if code != status || h.Get(httpx.ReplayedHeader) != "" || runs.Load() != 2 {
				t.Fatalf("retry: %d (Idempotent-Replayed %q) after %d runs; want %d from a second run: the key released", code, h.Get(httpx.ReplayedHeader), runs.Load(), status)
			}
		})
	}
}

// TestReplayContentTypeAsSent: "A replay has the Content-Type the first
// response had ... a response that went out without one (... removed
// outer middleware's) is replayed without one" (httpx's
// DefaultReplayHeader, whose semantics fiberx keeps). fasthttp sends its
// default type only with a Content-Length other than 0, and none for a
// 204 or a 304 unless the handler set one: a 204 or 304 with a body went
// out untyped and was replayed with "text/plain; charset=utf-8"; a
// handler that removed outer middleware's type from a response without a
// body went out untyped and was replayed with outer middleware's.
func TestReplayContentTypeAsSent(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	app.Use(func(c fiber.Ctx) error { // outer middleware: API responses are JSON
		if c.Path() == "/untyped" {
			c.Type("json")
		}
		return c.Next()
	})
	guarded := fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}})
	app.Post("/nocontent", guarded, func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(http.StatusNoContent).SendString("done")
	})
	app.Post("/notmodified", guarded, func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(http.StatusNotModified).Send([]byte("same"))
	})
	app.Post("/untyped", guarded, func(c fiber.Ctx) error {
		runs.Add(1)
		c.Response().Header.Del(fiber.HeaderContentType)
		c.Status(http.StatusAccepted) // no body
		return nil
	})
	for _, path := range []string{"/nocontent", "/notmodified", "/untyped"} {
		t.Run(path[1:], func(t *testing.T) {
			before := runs.Load()
			c1, h1, _ := post(t, app, path, "ct"+path)
			c2, h2, _ := post(t, app, path, "ct"+path)
			if h2.Get(httpx.ReplayedHeader) != "true" || c1 != c2 {
				t.Fatalf("retry: %d %v; first %d: want a replay", c2, h2, c1)
			}
			if n := runs.Load() - before; n != 1 {
				t.Fatalf("%d runs, want 1", n)
			}
			if got, want := h2.Values("Content-Type"), h1.Values("Content-Type"); len(got) != len(want) || len(got) > 0 && got[0] != want[0] {
				t.Fatalf("%d: first response went out with Content-Type %q, its replay with %q", c1, want, got)
			}
		})
	}
}

// TestTrailerOfBufferedBody: a field a handler declares as a trailer
// (fasthttp's ResponseHeader.SetTrailer) and sets, on a body Fiber sends
// with a Content-Length, reaches the client nowhere (fasthttp leaves
// declared trailers out of the header and sends no trailer section), so a
// replay does not send it either (it went out as an ordinary header
// field; "Trailers go out as trailers on the first response as on a
// replay", docs/design.md section 7).
func TestTrailerOfBufferedBody(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	app.Post("/pay", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		runs.Add(1)
		if err := c.Response().Header.SetTrailer("X-Checksum"); err != nil {
			return err
		}
		c.Set("X-Checksum", "abc")
		return c.Status(http.StatusCreated).SendString("charged")
	})
	c1, h1, b1 := post(t, app, "/pay", "tr-1")
	c2, h2, b2 := post(t, app, "/pay", "tr-1")
	if c1 != http.StatusCreated || c2 != c1 || b2 != b1 || h2.Get(httpx.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Fatalf("first %d %q, retry %d %q %v, %d runs: want a replay", c1, b1, c2, b2, h2, runs.Load())
	}
	if got, want := h2.Values("X-Checksum"), h1.Values("X-Checksum"); len(got) != len(want) {
		t.Fatalf("first response's header had X-Checksum %q, the replay's %q: the replay carries a field the client never got", want, got)
	}
}
