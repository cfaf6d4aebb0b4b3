package fiberx_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/conformance"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// fasthttp's own goroutines, which goleak passes over: the idle-worker
// cleaner of a server's worker pool (after Shutdown it sees the stop only
// when its sleep, up to 10 s, ends) and the process-wide clock of the
// Date header (started once, never stopped), and the workers of
// fasthttp's stackless compressors (Fiber's compress; started on first
// use, never stopped). No other goroutine may outlive the tests.
var fasthttpGoroutines = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	goleak.IgnoreAnyFunction("github.com/valyala/fasthttp/stackless.funcWorker"),
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, fasthttpGoroutines...) }

// testConfig is app.Test's bound in these tests: a hang's, not a busy
// machine's. Fiber's default gives up after 1 s with
// os.ErrDeadlineExceeded, a real-clock window that a request to the
// shared Redis can overrun under -race on a loaded CI machine.
var testConfig = fiber.TestConfig{Timeout: 30 * time.Second, FailOnTimeout: true}

// handler runs a conformance handler as a Fiber handler.
func handler(h conformance.Handler) fiber.Handler {
	return func(c fiber.Ctx) error {
		lease, _, claimed := fiberx.ClaimFrom(c)
		hdr := http.Header{}
		for k, vs := range c.GetReqHeaders() {
			hdr[k] = vs
		}
		resp := h(c.Context(), conformance.Req{Method: c.Method(), Path: c.Path(), Body: bytes.Clone(c.Body()),
			Header: hdr, Claimed: claimed, Lease: lease})
		if resp.Switch != nil {
			// As fasthttp/websocket's upgrader does: the 101 goes out
			// when the handlers returned, then the session runs.
			rc := c.RequestCtx()
			rc.HijackSetNoResponse(resp.Status == 0)
			rc.Hijack(func(conn net.Conn) {
				resp.Switch(bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn)))
			})
			if resp.Status == 0 {
				return nil
			}
		}
		for k, vs := range resp.Header {
			for _, v := range vs {
				c.Response().Header.Add(k, v)
			}
		}
		return c.Status(resp.Status).Send(resp.Body)
	}
}

// server serves h behind fiberx.Guard on a Fiber app listening on a
// loopback port, for the shared conformance suite.
func server(t testing.TB, g *guard.Guard, opts httpx.Options, h conformance.Handler) string {
	return serverWith(t, g, fiberx.Options{Options: opts}, h)
}

func serverWith(t testing.TB, g *guard.Guard, opts fiberx.Options, h conformance.Handler) string {
	app := newApp()
	var n atomic.Int64
	app.Use(func(c fiber.Ctx) error { // outer middleware
		c.Set("X-Request-Id", strconv.FormatInt(n.Add(1), 10))
		return c.Next()
	})
	guarded := fiberx.Guard(g, opts)
	app.All("/charges", guarded, handler(h))
	app.All("/storm", guarded, handler(h))
	return listen(t, app)
}

func newApp() *fiber.App { return fiber.New() }

// listen serves app on a loopback port until the test ends.
func listen(t testing.TB, app *fiber.App) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	t.Cleanup(func() {
		if err := app.Shutdown(); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("listener: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func TestConformance(t *testing.T) { conformance.Run(t, server) }

// TestConformanceUpgrade: fasthttp runs a hijacked connection's session
// after the handlers returned, so the key is released as it starts.
func TestConformanceUpgrade(t *testing.T) {
	conformance.RunUpgrade(t, server, conformance.UpgradeOptions{SessionAfterReturn: true})
}

// TestStorm: 1,000 keys × 8 copies over two Fiber apps on one Redis, each
// key's effect exactly once.
func TestStorm(t *testing.T) { t.Log(conformance.Storm(t, server, 1000, 8)) }

func post(t *testing.T, app *fiber.App, path, key string, header ...string) (int, http.Header, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
	req.Header.Set(httpx.DefaultHeader, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := app.Test(req, testConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(b)
}

// postConn posts a body with key to url on a connection of its own (a
// dropped one fails only this request): its response and body, or the
// error of a request that got none.
func postConn(url, key string) (*http.Response, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set(httpx.DefaultHeader, key)
	cl := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}
	res, err := cl.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b), nil
}

// TestTenantFromLocals: the caller named by a value an auth middleware
// stored in c.Locals keeps keys apart; no caller gets 401.
func TestTenantFromLocals(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	auth := func(c fiber.Ctx) error {
		if a := c.Get("X-Account"); a != "" {
			c.Locals("account", a)
		}
		return c.Next()
	}
	tenant := func(c fiber.Ctx) string { s, _ := c.Locals("account").(string); return s }
	app.Post("/pay", auth, fiberx.Guard(g, fiberx.Options{Tenant: tenant}), func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).SendString("run " + strconv.FormatInt(runs.Add(1), 10))
	})
	_, _, a := post(t, app, "/pay", "k", "X-Account", "alice")
	_, _, b := post(t, app, "/pay", "k", "X-Account", "bob")
	_, h, a2 := post(t, app, "/pay", "k", "X-Account", "alice")
	if a != "run 1" || b != "run 2" || a2 != "run 1" || h.Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("alice %q, bob %q, alice again %q %v", a, b, a2, h)
	}
	if code, _, body := post(t, app, "/pay", "k"); code != http.StatusUnauthorized {
		t.Fatalf("no caller: %d %s", code, body)
	}
}

// TestReturnedErrors: an error a handler returns is rendered by the app's
// ErrorHandler inside the guarded run: a 4xx is stored and replayed, a
// 5xx releases the key.
func TestReturnedErrors(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	app := newApp()
	app.Post("/err", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		runs.Add(1)
		code, _ := strconv.Atoi(c.Query("code"))
		return fiber.NewError(code, "no")
	})
	c1, _, b1 := post(t, app, "/err?code=404", "k404")
	c2, h2, b2 := post(t, app, "/err?code=404", "k404")
	if c1 != 404 || c2 != 404 || h2.Get(httpx.ReplayedHeader) != "true" || b1 != b2 {
		t.Fatalf("404: %d %q, replay %d %v %q", c1, b1, c2, h2, b2)
	}
	if c, _, _ := post(t, app, "/err?code=503", "k503"); c != 503 {
		t.Fatalf("503: %d", c)
	}
	if c, h, _ := post(t, app, "/err?code=503", "k503"); c != 503 || h.Get(httpx.ReplayedHeader) != "" {
		t.Fatalf("503 again: %d %v", c, h)
	}
	if runs.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3 (404 once, 503 twice)", runs.Load())
	}
}

// TestGroupMiddlewareScopesByPath: under a group's middleware (a Use
// route, whose path is a prefix) the scope is the request's path, so one
// key on two routes of the group is two keys' worth of scope, never a
// replay of the other route's response.
func TestGroupMiddlewareScopesByPath(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	app := newApp()
	grp := app.Group("/v1", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}))
	grp.Post("/a", func(c fiber.Ctx) error { return c.Status(201).SendString("a") })
	grp.Post("/b", func(c fiber.Ctx) error { return c.Status(201).SendString("b") })
	if _, _, a := post(t, app, "/v1/a", "k"); a != "a" {
		t.Fatalf("a: %q", a)
	}
	if code, h, b := post(t, app, "/v1/b", "k"); code != 201 || b != "b" || h.Get(httpx.ReplayedHeader) != "" {
		t.Fatalf("b with a's key: %d %v %q", code, h, b)
	}
}

// TestGuardPanicsWithoutCallerChoice: none, or two, of the caller choices
// is a programmer's error.
func TestGuardPanicsWithoutCallerChoice(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	tenant := func(fiber.Ctx) string { return "a" }
	for name, opts := range map[string]fiberx.Options{
		"none":              {},
		"both tenants":      {Tenant: tenant, Options: httpx.Options{Tenant: func(*http.Request) string { return "a" }}},
		"tenant and single": {Tenant: tenant, Options: httpx.Options{SingleCaller: true}},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.HasPrefix(p.(string), "fiberx.Guard") {
					t.Errorf("%s: panic %v, want one from fiberx.Guard", name, p)
				}
			}()
			fiberx.Guard(g, opts)
		}()
	}
}
