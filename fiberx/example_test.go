package fiberx_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/gofiber/fiber/v3"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// A Fiber route whose handler charges once per Idempotency-Key and
// caller; the retry gets the stored response.
func ExampleGuard() {
	mr, _ := miniredis.Run() // a real Redis in production
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	app := fiber.New()
	auth := func(c fiber.Ctx) error { c.Locals("account", "acct_1"); return c.Next() } // your authentication
	charges := 0
	app.Post("/charges", auth, fiberx.Guard(g, fiberx.Options{
		Tenant: func(c fiber.Ctx) string { s, _ := c.Locals("account").(string); return s },
	}), func(c fiber.Ctx) error {
		lease, _, _ := fiberx.ClaimFrom(c) // lease.Fence for downstream writes
		charges++
		return c.Status(http.StatusCreated).JSON(fiber.Map{"charge": charges, "fence": lease.Fence})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", "order-42")
		res, err := app.Test(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(res.StatusCode, string(body), "replayed:", res.Header.Get(httpx.ReplayedHeader) == "true")
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":1,"fence":1} replayed: false
	// 201 {"charge":1,"fence":1} replayed: true
	// charges: 1
}
