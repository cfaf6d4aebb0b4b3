package fiberx_test

import (
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

// TestSendStreamNotKept: a body the handler streams (SendStream,
// SendStreamWriter) goes out after the guard has stored the answer, so
// it is not kept whatever its size: the retry gets the response-not-kept
// problem with the first answer's status, saying the body was streamed,
// not that it was larger than the server keeps (a 13-byte stream is not).
func TestSendStreamNotKept(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	app.Post("/pay", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		runs.Add(1)
		return c.Status(http.StatusCreated).SendStream(strings.NewReader("hello, world!"))
	})
	if c, _, b := post(t, app, "/pay", "ss-1"); c != http.StatusCreated || b != "hello, world!" {
		t.Fatalf("first: %d %q", c, b)
	}
	c, h, b := post(t, app, "/pay", "ss-1")
	if c != http.StatusCreated || h.Get(httpx.ReplayedHeader) != "true" || !strings.Contains(b, httpx.ProblemResponseNotKept) {
		t.Fatalf("retry: %d %v %s; want the response-not-kept problem, 201", c, h, b)
	}
	if strings.Contains(b, "larger") || !strings.Contains(b, "streamed") {
		t.Fatalf("retry's problem: %s; want it to say the body was streamed", b)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}
