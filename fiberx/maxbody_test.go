package fiberx_test

import (
	"io"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestStreamedBodyUnlimited: MaxBody set to the largest int64 (no limit
// in practice) with Fiber's StreamRequestBody. A chunked body is read
// whole: the handler and the fingerprint see it, and the same key with
// another body gets 422. The guard read it up to MaxBody+1 bytes, which
// overflowed to a negative limit: the body read as empty, the handler
// charged nothing, and another body under the key was replayed the first
// one's answer.
func TestStreamedBodyUnlimited(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := fiber.New(fiber.Config{StreamRequestBody: true})
	opts := fiberx.Options{Options: httpx.Options{SingleCaller: true, MaxBody: math.MaxInt64}}
	app.Post("/pay", fiberx.Guard(g, opts), func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(http.StatusCreated).SendString("paid " + string(c.Body()))
	})
	base := listen(t, app)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	pay := func(body string) (int, string) {
		t.Helper()
		// A reader of unknown length: sent chunked.
		req, err := http.NewRequest(http.MethodPost, base+"/pay", io.MultiReader(strings.NewReader(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(httpx.DefaultHeader, "k1")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if code, body := pay("amount=100"); code != http.StatusCreated || body != "paid amount=100" {
		t.Fatalf("first: %d %q; want 201 paid amount=100", code, body)
	}
	if code, body := pay("amount=999"); code != http.StatusUnprocessableEntity {
		t.Fatalf("another body under the key: %d %q; want 422", code, body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs %d, want 1", n)
	}
}
