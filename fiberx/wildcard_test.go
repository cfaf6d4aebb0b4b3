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

// TestWildcardRouteScope: the doc says the scope of a route's own Guard
// is the route path Fiber matched (c.Route().Path), as it is the pattern
// under httpx ("/files/{p...}"), Gin ("/files/*p") and Echo ("/files/*"):
// a key reused for another request on the same route is refused 422
// there. Under a wildcard route whose match spans more segments than the
// pattern, fiberx took the request's path as the scope instead, so the
// same key on two paths of the route ran the handler twice.
func TestWildcardRouteScope(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	app.Post("/files/*", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).SendString("put " + c.Params("*") + " " + strconv.FormatInt(runs.Add(1), 10))
	})
	if code, _, body := post(t, app, "/files/a/b", "wild-1"); code != http.StatusCreated {
		t.Fatalf("first: %d %q", code, body)
	}
	code, _, body := post(t, app, "/files/c/d", "wild-1")
	if code != http.StatusUnprocessableEntity || runs.Load() != 1 {
		t.Errorf("same key, other path of the route: %d %q, handler ran %d times; want 422 and one run (the route's scope)", code, body, runs.Load())
	}
}
