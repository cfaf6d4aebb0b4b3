package fiberx_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

type accountKey struct{}

// TestHTTPRequestContext: the *http.Request the funcs of httpx.Options
// get carries the Fiber context's context.Context (c.Context()), as a
// net/http request carries what middleware put in its context: a Tenant
// such as httpx.TenantFromContext or httpx.TenantFromJWT, over a value an
// authentication middleware stored with c.SetContext, names the caller
// (with context.Background() it named none: every request 401).
func TestHTTPRequestContext(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	app := newApp()
	auth := func(c fiber.Ctx) error {
		c.SetContext(context.WithValue(c.Context(), accountKey{}, c.Get("X-Account")))
		return c.Next()
	}
	opts := httpx.Options{Tenant: httpx.TenantFromContext[string](accountKey{}, nil)}
	app.Post("/pay", auth, fiberx.Guard(g, fiberx.Options{Options: opts}), func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).SendString("paid")
	})
	c1, _, _ := post(t, app, "/pay", "k1", "X-Account", "acct-1")
	c2, h2, _ := post(t, app, "/pay", "k1", "X-Account", "acct-1")
	c3, h3, _ := post(t, app, "/pay", "k1", "X-Account", "acct-2")
	if c1 != http.StatusCreated || c2 != http.StatusCreated || h2.Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("first %d, retry %d %v; want 201, then 201 replayed", c1, c2, h2)
	}
	if c3 != http.StatusCreated || h3.Get(httpx.ReplayedHeader) != "" {
		t.Fatalf("another account's key: %d %v; want its own run", c3, h3)
	}
}
