package fiberx_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

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
