package fiberx_test

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestGroupScopeFollowsRouting: under a group's middleware (or app.Use)
// the scope is the request's path as Fiber routes it: by default without
// case and without a trailing slash (CaseSensitive, StrictRouting false).
// A retry under the same key at such a variant of its path reaches the
// same handler, and is replayed or refused (422, as under a route's own
// Guard, whose scope is the route), never run again. (It ran again: the
// scope was the path as sent.)
func TestGroupScopeFollowsRouting(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	grp := app.Group("/v1", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}))
	grp.Post("/orders", func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).SendString("order " + strconv.FormatInt(runs.Add(1), 10))
	})
	for i, variant := range []string{"/v1/Orders", "/v1/orders/"} {
		key := "variant-" + strconv.Itoa(i)
		code, _, body := post(t, app, "/v1/orders", key)
		if code != http.StatusCreated {
			t.Fatalf("first: %d %q", code, body)
		}
		before := runs.Load()
		code2, h2, body2 := post(t, app, variant, key)
		if runs.Load() != before {
			t.Errorf("POST %s with the key of POST /v1/orders (%q): %d %q (replayed %q): the handler ran again under the same key",
				variant, body, code2, body2, h2.Get(httpx.ReplayedHeader))
		}
	}
}
