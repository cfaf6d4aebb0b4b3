package fiberx_test

import (
	"net/http"
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

// TestInformationalFinalStatus: a Fiber handler that ends with an
// informational status (c.SendStatus(fiber.StatusProcessing), c.Status(100))
// has fasthttp send it as the response: no final answer a replay could
// repeat, nor one the stored format keeps ("no 1xx is stored"). The key is
// released, as for a 101 (it was stored, and every retry got 500 "stored
// response unreadable" for the whole TTL).
func TestInformationalFinalStatus(t *testing.T) {
	for _, status := range []int{http.StatusContinue, http.StatusProcessing, http.StatusEarlyHints} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			g := guardenv.Guard(t, guard.Options{})
			var runs atomic.Int64
			app := newApp()
			app.Post("/jobs", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
				runs.Add(1)
				return c.SendStatus(status)
			})
			first, _, _ := post(t, app, "/jobs", "inf-1")
			if first != status {
				t.Fatalf("first: %d, want %d (what fasthttp sends)", first, status)
			}
			code, h, body := post(t, app, "/jobs", "inf-1")
			if code == http.StatusInternalServerError || strings.Contains(body, httpx.ProblemCorruptResponse) {
				t.Fatalf("retry: %d %s (Idempotent-Replayed %q, %d runs); the guard stored a record it cannot read: "+
					"want a readable answer (the run released, as a 101, or stored as a final status), not 500 for the TTL",
					code, body, h.Get(httpx.ReplayedHeader), runs.Load())
			}
			if code != status || h.Get(httpx.ReplayedHeader) != "" || runs.Load() != 2 {
				t.Fatalf("retry: %d (Idempotent-Replayed %q) after %d runs; want %d from a second run: the key released", code, h.Get(httpx.ReplayedHeader), runs.Load(), status)
			}
		})
	}
}
