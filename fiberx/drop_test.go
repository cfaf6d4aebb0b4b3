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

// A middleware after the guard that sheds load with c.Drop() closes the
// connection: the client gets no answer, the handler never ran. The guard
// stored fasthttp's untouched 200 with an empty body, and every retry of
// the key was told it had succeeded, the charge never made. A closed
// connection keeps the marker of a handler that took the connection now.
func TestDroppedConnectionNotStoredAsSuccess(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs, seen atomic.Int64
	app := newApp()
	shed := func(c fiber.Ctx) error {
		if seen.Add(1) == 1 { // overloaded on the first attempt
			return c.Drop()
		}
		return c.Next()
	}
	app.Post("/pay", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), shed, func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(http.StatusCreated).SendString("charged")
	})
	url := listen(t, app) + "/pay"
	send := func() (*http.Response, string, error) { return postConn(url, "dropped") }
	if res, body, err := send(); err == nil {
		t.Fatalf("first: %d %q; want the connection dropped", res.StatusCode, body)
	}
	// The client sees the connection close before the guard has kept the
	// key's answer: a retry meanwhile is told the key is in progress (409),
	// and asks again, as a client would.
	var res *http.Response
	var body string
	testenv.WaitFor(t, 10*time.Second, "the key's answer (not in progress)", func() bool {
		var err error
		res, body, err = send()
		return err == nil && res.StatusCode != http.StatusConflict
	})
	if res.StatusCode == http.StatusOK && body == "" {
		t.Fatalf("retry: 200 with an empty body (replayed %q): a success the dropped request never answered; the charge ran %d times",
			res.Header.Get(httpx.ReplayedHeader), runs.Load())
	}
	if res.StatusCode < 500 || !strings.Contains(body, "not kept") || runs.Load() != 0 {
		t.Errorf("retry: %d %q, the charge ran %d times; want the key's not-kept marker with a 5xx (no success), the charge not run", res.StatusCode, body, runs.Load())
	}
}
