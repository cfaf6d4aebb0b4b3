package echox_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemguard/idemguard/echox"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestBodyLimitBeforeGuard: Echo's BodyLimit before the guard checks a
// declared Content-Length itself, but a chunked body it can only stop
// as it is read, and the guard reads it: past the limit, the answer is
// 413 (the guard's body-too-large problem), not 400 "body unreadable",
// nothing is stored and the handler does not run, so the same key with
// a body within the limit runs.
func TestBodyLimitBeforeGuard(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	e := newEcho()
	e.POST("/pay", func(c echo.Context) error {
		runs.Add(1)
		b, _ := io.ReadAll(c.Request().Body)
		return c.String(http.StatusCreated, "got "+string(b))
	}, middleware.BodyLimit("1K"), echox.Guard(g, echox.Options{Options: httpx.Options{SingleCaller: true}}))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	send := func(body string) (int, string, string) {
		t.Helper()
		// A reader of unknown length: the body goes out chunked.
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", io.MultiReader(strings.NewReader(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(httpx.DefaultHeader, "bl-1")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("Content-Type"), string(b)
	}
	if c, ct, b := send(strings.Repeat("x", 2048)); c != http.StatusRequestEntityTooLarge || ct != "application/problem+json" ||
		!strings.Contains(b, httpx.ProblemBodyTooLarge) {
		t.Fatalf("chunked body past BodyLimit: %d %s %s; want the 413 problem", c, ct, b)
	}
	if c, _, b := send("small"); c != http.StatusCreated || b != "got small" {
		t.Fatalf("the same key within the limit: %d %q; want it run", c, b)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
}
