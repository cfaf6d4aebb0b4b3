package echox_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/echox"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/conformance"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handler runs a conformance handler as an Echo handler.
func handler(h conformance.Handler) echo.HandlerFunc {
	return func(c echo.Context) error {
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return err
		}
		lease, _, claimed := echox.ClaimFrom(c)
		resp := h(c.Request().Context(), conformance.Req{Method: c.Request().Method, Path: c.Request().URL.Path, Body: body,
			Header: c.Request().Header, Claimed: claimed, Lease: lease})
		if resp.Switch != nil {
			return switchProtocols(c, resp)
		}
		for k, vs := range resp.Header {
			for _, v := range vs {
				c.Response().Header().Add(k, v)
			}
		}
		return c.Blob(resp.Status, resp.Header.Get("Content-Type"), resp.Body)
	}
}

// switchProtocols answers resp's 101 (if it has one) and runs its session
// on the connection, as coder/websocket (WriteHeader, then Hijack) or
// gorilla/websocket (the 101 written on the connection) does.
func switchProtocols(c echo.Context, resp conformance.Resp) error {
	for k, vs := range resp.Header {
		for _, v := range vs {
			c.Response().Header().Add(k, v)
		}
	}
	if resp.Status != 0 {
		c.Response().WriteHeader(resp.Status)
	}
	conn, brw, err := http.NewResponseController(c.Response()).Hijack()
	if err != nil {
		return err
	}
	defer conn.Close()
	resp.Switch(brw)
	return nil
}

// server serves h behind echox.Guard on an Echo instance, for the shared
// conformance suite.
func server(t testing.TB, g *guard.Guard, opts httpx.Options, h conformance.Handler) string {
	e := newEcho()
	var n atomic.Int64
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // outer middleware
		return func(c echo.Context) error {
			c.Response().Header().Set("X-Request-Id", strconv.FormatInt(n.Add(1), 10))
			return next(c)
		}
	})
	guarded := e.Group("", echox.Guard(g, echox.Options{Options: opts}))
	guarded.Any("/charges", handler(h))
	guarded.Any("/storm", handler(h))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL
}

func newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	return e
}

func TestConformance(t *testing.T) { conformance.Run(t, server) }

func TestConformanceUpgrade(t *testing.T) {
	conformance.RunUpgrade(t, server, conformance.UpgradeOptions{})
}

// TestStorm: 1,000 keys × 8 copies over two Echo servers on one Redis,
// each key's effect exactly once.
func TestStorm(t *testing.T) { t.Log(conformance.Storm(t, server, 1000, 8)) }

func post(t *testing.T, h http.Handler, path, key string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
	req.Header.Set(httpx.DefaultHeader, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestTenantFromEchoContext: the caller named by a value an auth
// middleware c.Set keeps keys apart; no caller gets 401.
func TestTenantFromEchoContext(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	e := newEcho()
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if a := c.Request().Header.Get("X-Account"); a != "" {
				c.Set("account", a)
			}
			return next(c)
		}
	}
	tenant := func(c echo.Context) string { s, _ := c.Get("account").(string); return s }
	e.POST("/pay", func(c echo.Context) error {
		return c.String(http.StatusCreated, "run "+strconv.FormatInt(runs.Add(1), 10))
	},
		auth, echox.Guard(g, echox.Options{Tenant: tenant}))
	a := post(t, e, "/pay", "k", "X-Account", "alice")
	b := post(t, e, "/pay", "k", "X-Account", "bob")
	a2 := post(t, e, "/pay", "k", "X-Account", "alice")
	if a.Body.String() != "run 1" || b.Body.String() != "run 2" || a2.Body.String() != "run 1" || a2.Header().Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("alice %q, bob %q, alice again %q %v", a.Body, b.Body, a2.Body, a2.Header())
	}
	if w := post(t, e, "/pay", "k"); w.Code != http.StatusUnauthorized {
		t.Fatalf("no caller: %d %s", w.Code, w.Body)
	}
}

// TestReturnedErrors: an error the handler returns is rendered inside the
// guarded run: a 4xx HTTPError is stored and replayed, a 5xx releases the
// key (the retry runs again).
func TestReturnedErrors(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	e := newEcho()
	e.POST("/err", func(c echo.Context) error {
		runs.Add(1)
		code, _ := strconv.Atoi(c.QueryParam("code"))
		return echo.NewHTTPError(code, "no")
	}, echox.Guard(g, echox.Options{Options: httpx.Options{SingleCaller: true}}))
	first := post(t, e, "/err?code=404", "k404")
	replay := post(t, e, "/err?code=404", "k404")
	if first.Code != 404 || replay.Code != 404 || replay.Header().Get(httpx.ReplayedHeader) != "true" || replay.Body.String() != first.Body.String() {
		t.Fatalf("404: %d %q, replay %d %v %q", first.Code, first.Body, replay.Code, replay.Header(), replay.Body)
	}
	if w := post(t, e, "/err?code=503", "k503"); w.Code != 503 {
		t.Fatalf("503: %d", w.Code)
	}
	if w := post(t, e, "/err?code=503", "k503"); w.Code != 503 || w.Header().Get(httpx.ReplayedHeader) != "" {
		t.Fatalf("503 again: %d %v", w.Code, w.Header())
	}
	if runs.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3 (404 once, 503 twice)", runs.Load())
	}
}

// TestGuardPanicsWithoutCallerChoice: none, or two, of the caller choices
// is a programmer's error.
func TestGuardPanicsWithoutCallerChoice(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	tenant := func(echo.Context) string { return "a" }
	for name, opts := range map[string]echox.Options{
		"none":              {},
		"both tenants":      {Tenant: tenant, Options: httpx.Options{Tenant: func(*http.Request) string { return "a" }}},
		"tenant and single": {Tenant: tenant, Options: httpx.Options{SingleCaller: true}},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.HasPrefix(p.(string), "echox.Guard") {
					t.Errorf("%s: panic %v, want one from echox.Guard", name, p)
				}
			}()
			echox.Guard(g, opts)
		}()
	}
}
