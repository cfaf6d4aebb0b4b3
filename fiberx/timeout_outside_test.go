package fiberx_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// Fiber's timeout middleware around the guard answers the client (408)
// in the response the handler goes on writing, and marks the context
// abandoned. The guard took the status it then found (the 408, when the
// handler set none) for the handler's and released the key: the retry
// ran the charge again. It keeps a "not kept" marker now, whatever the
// response holds (which it does not read then: the middleware writes it
// from its own goroutine), and the retry is answered from it. The handler
// here abandons the context and sets the 408 itself, as the middleware
// does: with the middleware itself the test races with it (it writes the
// response while the handler chain reads and writes it: Fiber's own
// race, which -race reports).
func TestTimeoutOutsideGuardKeepsKey(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	guarded := fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}})
	app.Post("/charge", guarded, func(c fiber.Ctx) error {
		runs.Add(1) // the charge
		c.Abandon() // what timeout.New does at its deadline, then:
		return c.SendStatus(fiber.StatusRequestTimeout)
	})
	url := listen(t, app) + "/charge"
	send := func() (int, string, string) {
		t.Helper()
		res, body, err := postConn(url, "timeout-outside")
		if err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, res.Header.Get(httpx.ReplayedHeader), body
	}
	if code, _, body := send(); code != http.StatusRequestTimeout {
		t.Fatalf("first: %d %q; want the 408", code, body)
	}
	var code int
	var replayed, body string
	testenv.WaitFor(t, 10*time.Second, "the key's answer (not in progress)", func() bool {
		code, replayed, body = send()
		return code != http.StatusConflict
	})
	if n := runs.Load(); n != 1 || replayed != "true" || !strings.Contains(body, "not kept") {
		t.Fatalf("the charge ran %d times; the retry: %d, replayed %q, %s; want one run and the key's not-kept marker replayed", n, code, replayed, body)
	}
}
