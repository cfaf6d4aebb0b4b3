package fiberx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestHeaderNamesNotNormalized: with Fiber's DisableHeaderNormalizing,
// fasthttp keeps header names as the client spelled them and looks them
// up case-sensitively; HTTP/2 clients (and proxies that pass their
// fields on) spell every name in lower case. Header names are
// case-insensitive (RFC 9110 section 5.1): a key sent as
// "idempotency-key" is the key, so the retry is replayed, not run again
// (with Optional, a key not seen would run unguarded: two charges).
func TestHeaderNamesNotNormalized(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := fiber.New(fiber.Config{DisableHeaderNormalizing: true})
	opts := fiberx.Options{Options: httpx.Options{SingleCaller: true, Optional: true}}
	app.Post("/pay", fiberx.Guard(g, opts), func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).SendString("run " + strconv.FormatInt(runs.Add(1), 10))
	})
	send := func() (int, http.Header, string) {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
		req.Header = http.Header{"idempotency-key": {"k-lower"}, "content-type": {"application/json"}} // as an HTTP/2 client names them
		res, err := app.Test(req, testConfig)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b)
	}
	c1, _, b1 := send()
	c2, h2, b2 := send()
	if c1 != http.StatusCreated || c2 != http.StatusCreated || b1 != "run 1" || b2 != "run 1" || h2.Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("first %d %q, retry %d %q %v: the lower-case key was not seen", c1, b1, c2, b2, h2)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	// Two fields whose names differ only in case are two keys: 400, as
	// under net/http.
	req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"amount":1}`))
	req.Header = http.Header{"idempotency-key": {"k-a"}, "Idempotency-Key": {"k-b"}}
	res, err := app.Test(req, testConfig)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || runs.Load() != 1 {
		t.Fatalf("two key fields: %d, runs %d; want 400 and no run", res.StatusCode, runs.Load())
	}
}
