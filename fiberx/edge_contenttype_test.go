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
