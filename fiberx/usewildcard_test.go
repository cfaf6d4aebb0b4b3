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
// prefix (app.Use("/api/*", guard)) is a prefix over many routes, as
// app.Use("/api", guard) is: two routes under it are two scopes, so one
// key used on /api/v1/orders and then on /api/v1/refunds runs both handlers,
// as it does under app.Use("/api", guard). (The wildcard-route rule of
// 1c5f203 made "/api/*" the scope of every request under it whose path
// has another number of segments than the prefix: 422 for the refund.)
func TestUseWildcardPrefixScope(t *testing.T) {
	for _, prefix := range []string{"/api", "/api/*"} {
		t.Run(prefix, func(t *testing.T) {
			g := guardenv.Guard(t, guard.Options{})
			var orders, refunds atomic.Int64
			app := newApp()
			app.Use(prefix, fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}))
			app.Post("/api/v1/orders", func(c fiber.Ctx) error {
				orders.Add(1)
				return c.Status(http.StatusCreated).SendString("order")
			})
			app.Post("/api/v1/refunds", func(c fiber.Ctx) error {
				refunds.Add(1)
				return c.Status(http.StatusCreated).SendString("refund")
			})
			if code, _, body := post(t, app, "/api/v1/orders", "use-wild-1"); code != http.StatusCreated || orders.Load() != 1 {
				t.Fatalf("orders: %d %q, ran %d", code, body, orders.Load())
			}
			code, h, body := post(t, app, "/api/v1/refunds", "use-wild-1")
			if code != http.StatusCreated || body != "refund" || refunds.Load() != 1 {
				t.Errorf("refunds with the key /api/v1/orders used: %d %q (replayed %q), refunds ran %d times; want the refund run (another route, another scope)",
					code, body, h.Get(httpx.ReplayedHeader), refunds.Load())
			}
		})
	}
}
