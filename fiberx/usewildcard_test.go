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

// TestUseWildcardPrefixScope: a middleware mounted with a wildcard
// prefix (app.Use("/api/*", guard), a group's Use("/*", guard)) is a
// prefix over many routes, as app.Use("/api", guard) is: two routes under
// it are two scopes, so one key used on one route and then on the other
// runs both handlers. The wildcard-route rule of 1c5f203 made "/api/*" the
// scope of requests under it deeper than the pattern (422 for the refund);
// 69e169f's fix still did so for paths as deep as the pattern
// (/api/orders, /api/refunds).
func TestUseWildcardPrefixScope(t *testing.T) {
	mounts := map[string]func(app *fiber.App, h fiber.Handler){
		"app.Use(/api)":       func(app *fiber.App, h fiber.Handler) { app.Use("/api", h) },
		"app.Use(/api/*)":     func(app *fiber.App, h fiber.Handler) { app.Use("/api/*", h) },
		"Group(/api).Use(/*)": func(app *fiber.App, h fiber.Handler) { app.Group("/api").Use("/*", h) },
	}
	for name, mount := range mounts {
		for _, base := range []string{"/api/v1", "/api"} { // deeper than the pattern, as deep
			t.Run(name+" "+base, func(t *testing.T) {
				g := guardenv.Guard(t, guard.Options{})
				var orders, refunds atomic.Int64
				app := newApp()
				mount(app, fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}))
				app.Post(base+"/orders", func(c fiber.Ctx) error {
					orders.Add(1)
					return c.Status(http.StatusCreated).SendString("order")
				})
				app.Post(base+"/refunds", func(c fiber.Ctx) error {
					refunds.Add(1)
					return c.Status(http.StatusCreated).SendString("refund")
				})
				if code, _, body := post(t, app, base+"/orders", "use-wild-1"); code != http.StatusCreated || orders.Load() != 1 {
					t.Fatalf("orders: %d %q, ran %d", code, body, orders.Load())
				}
				code, h, body := post(t, app, base+"/refunds", "use-wild-1")
				if code != http.StatusCreated || body != "refund" || refunds.Load() != 1 {
					t.Errorf("refunds with the key %s/orders used: %d %q (replayed %q), refunds ran %d times; want the refund run (another route, another scope)",
						base, code, body, h.Get(httpx.ReplayedHeader), refunds.Load())
				}
			})
		}
	}
}
