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

// TestUseWildcardSameDepth: 69e169f says a middleware's route is a
// prefix "whatever its pattern". Under app.Use("/api/*", guard) (or a
// group's), a request whose path has as many segments as the pattern
// (/api/orders, /api/refunds) still gets the pattern "/api/*" as its
// scope, so two routes share keys: the refund is refused (422) or
// replayed, where app.Use("/api", guard) runs it.
func TestUseWildcardSameDepth(t *testing.T) {
	mounts := map[string]func(app *fiber.App, h fiber.Handler){
		"app.Use(/api)":   func(app *fiber.App, h fiber.Handler) { app.Use("/api", h) },
		"app.Use(/api/*)": func(app *fiber.App, h fiber.Handler) { app.Use("/api/*", h) },
		"Group(/api).Use(/*)": func(app *fiber.App, h fiber.Handler) {
			app.Group("/api").Use("/*", h)
		},
	}
	for name, mount := range mounts {
		t.Run(name, func(t *testing.T) {
			g := guardenv.Guard(t, guard.Options{})
			var orders, refunds atomic.Int64
			app := newApp()
			mount(app, fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}))
			app.Post("/api/orders", func(c fiber.Ctx) error {
				orders.Add(1)
				return c.Status(http.StatusCreated).SendString("order")
			})
			app.Post("/api/refunds", func(c fiber.Ctx) error {
				refunds.Add(1)
				return c.Status(http.StatusCreated).SendString("refund")
			})
			if code, _, body := post(t, app, "/api/orders", "same-depth"); code != http.StatusCreated || orders.Load() != 1 {
				t.Fatalf("orders: %d %q, ran %d", code, body, orders.Load())
			}
			code, h, body := post(t, app, "/api/refunds", "same-depth")
			if code != http.StatusCreated || body != "refund" || refunds.Load() != 1 {
				t.Errorf("refunds with the key /api/orders used: %d %q (replayed %q), refunds ran %d times; want the refund run (another route, another scope)",
					code, body, h.Get(httpx.ReplayedHeader), refunds.Load())
			}
		})
	}
}
