package fiberx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestHTTPRequestKeepsEveryValue: the *http.Request the funcs of
// httpx.Options get has every value of a field sent more than once, in
// order, as net/http gives them (fasthttp's adaptor keeps the last one
// only). A Tenant written for net/http takes the first value, as the
// Fiber middleware before it does (c.Get); were it given the last, a
// request whose first X-Account an authentication middleware checked
// would be scoped to the account named second, and get that account's
// stored response replayed. Likewise with normalizing off, where the two
// fields are spelled in different case.
func TestHTTPRequestKeepsEveryValue(t *testing.T) {
	for _, normalize := range []bool{true, false} {
		g := guardenv.Guard(t, guard.Options{})
		var (
			mu   sync.Mutex
			seen [][]string
			runs atomic.Int64
		)
		opts := httpx.Options{Tenant: func(r *http.Request) string {
			mu.Lock()
			seen = append(seen, r.Header.Values("X-Account"))
			mu.Unlock()
			return r.Header.Get("X-Account")
		}}
		app := fiber.New(fiber.Config{DisableHeaderNormalizing: !normalize})
		app.Post("/pay", func(c fiber.Ctx) error {
			// The authentication middleware: it checks the first value.
			c.Locals("account", c.Get("X-Account"))
			return c.Next()
		}, fiberx.Guard(g, fiberx.Options{Options: opts}), func(c fiber.Ctx) error {
			runs.Add(1)
			return c.Status(http.StatusCreated).SendString("paid by " + c.Locals("account").(string))
		})
		send := func(h http.Header) (int, string) {
			req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
			req.Header = h
			res, err := app.Test(req, testConfig)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, string(b)
		}
		key := httpx.DefaultHeader
		if c, b := send(http.Header{key: {"k1"}, "X-Account": {"victim"}}); c != http.StatusCreated || b != "paid by victim" {
			t.Fatalf("first: %d %q", c, b)
		}
		h := http.Header{key: {"k1"}, "X-Account": {"mallory", "victim"}}
		if !normalize {
			h = http.Header{key: {"k1"}, "X-Account": {"mallory"}, "x-account": {"victim"}}
		}
		c, b := send(h)
		mu.Lock()
		last := seen[len(seen)-1]
		mu.Unlock()
		if !slices.Equal(last, []string{"mallory", "victim"}) {
			t.Errorf("normalize %v: Tenant saw X-Account %q; want both values, in order", normalize, last)
		}
		if c != http.StatusCreated || b != "paid by mallory" || runs.Load() != 2 {
			t.Errorf("normalize %v: mallory's request got %d %q (runs %d); want its own run", normalize, c, b, runs.Load())
		}
	}
}
