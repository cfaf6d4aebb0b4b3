package fiberx_test

// The README's Fiber snippet, verbatim (TestSnippetsInTests in internal/testenv checks that
// it still is), run.

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/memstore"
)

func ExampleGuard_readme() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	app := fiber.New()
	auth := func(c fiber.Ctx) error { c.Locals("account", c.Get("Authorization")); return c.Next() } // your authentication
	charges := 0
	charge := func(c fiber.Ctx) error {
		charges++
		return c.Status(http.StatusCreated).SendString(fmt.Sprint("charge ", charges))
	}

	// Fiber v3: go get github.com/idemguard/idemguard/fiberx
	app.Post("/charges", auth, fiberx.Guard(g, fiberx.Options{
		Tenant: func(c fiber.Ctx) string { s, _ := c.Locals("account").(string); return s },
	}), charge)

	for _, account := range []string{"acct_1", "acct_1", "acct_2"} {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Authorization", account)
		req.Header.Set("Idempotency-Key", "order-42")
		res, err := app.Test(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Println(account, res.StatusCode, string(body), "replayed:", res.Header.Get(httpx.ReplayedHeader) == "true")
	}
	// Output:
	// acct_1 201 charge 1 replayed: false
	// acct_1 201 charge 1 replayed: true
	// acct_2 201 charge 2 replayed: false
}
