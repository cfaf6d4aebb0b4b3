package ginx_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

func post(t *testing.T, h http.Handler, path, key, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set(httpx.DefaultHeader, key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestTenantFromGinContext: the caller named by a value an auth
// middleware c.Set keeps keys apart; no caller gets 401.
func TestTenantFromGinContext(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) {
		if a := c.GetHeader("X-Account"); a != "" {
			c.Set("account", a)
		}
	})
	r.POST("/pay", ginx.Guard(g, ginx.Options{Tenant: func(c *gin.Context) string { return c.GetString("account") }}),
		func(c *gin.Context) { c.String(http.StatusCreated, "run %d", runs.Add(1)) })
	a := post(t, r, "/pay", "k", "{}", "X-Account", "alice")
	b := post(t, r, "/pay", "k", "{}", "X-Account", "bob")
	a2 := post(t, r, "/pay", "k", "{}", "X-Account", "alice")
	if a.Body.String() != "run 1" || b.Body.String() != "run 2" || a2.Body.String() != "run 1" || a2.Header().Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("alice %q, bob %q, alice again %q %v", a.Body, b.Body, a2.Body, a2.Header())
	}
	if w := post(t, r, "/pay", "k", "{}"); w.Code != http.StatusUnauthorized {
		t.Fatalf("no caller: %d %s", w.Code, w.Body)
	}
}

// TestGinStatusThenHeader: Gin holds the status until the body, so a
// header set after c.Status still goes out, and is replayed; a status
// without a body (204) is stored too; the handlers after an answered
// request do not run.
func TestGinStatusThenHeader(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var after atomic.Int64
	r := gin.New()
	r.POST("/x", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), func(c *gin.Context) {
		c.Status(http.StatusAccepted)
		c.Header("X-Late", "yes")
		if c.Query("empty") == "" {
			_, _ = c.Writer.WriteString("body")
		}
	}, func(c *gin.Context) { after.Add(1) })
	for _, path := range []string{"/x", "/x?empty=1"} {
		first := post(t, r, path, "k"+path, "")
		replay := post(t, r, path, "k"+path, "")
		for _, w := range []*httptest.ResponseRecorder{first, replay} {
			if w.Code != http.StatusAccepted || w.Header().Get("X-Late") != "yes" {
				t.Fatalf("%s: %d %v", path, w.Code, w.Header())
			}
		}
		if replay.Header().Get(httpx.ReplayedHeader) != "true" || replay.Body.String() != first.Body.String() {
			t.Fatalf("%s: replay %v %q, first %q", path, replay.Header(), replay.Body, first.Body)
		}
	}
	if after.Load() != 2 {
		t.Fatalf("the next handler ran %d times, want 2 (once per first request, never for a replay)", after.Load())
	}
}

// TestGuardPanicsWithoutCallerChoice: none, or two, of the caller choices
// is a programmer's error.
func TestGuardPanicsWithoutCallerChoice(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	tenant := func(c *gin.Context) string { return "a" }
	for name, opts := range map[string]ginx.Options{
		"none":              {},
		"both tenants":      {Tenant: tenant, Options: httpx.Options{Tenant: func(*http.Request) string { return "a" }}},
		"tenant and single": {Tenant: tenant, Options: httpx.Options{SingleCaller: true}},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.HasPrefix(p.(string), "ginx.Guard") {
					t.Errorf("%s: panic %v, want one from ginx.Guard", name, p)
				}
			}()
			ginx.Guard(g, opts)
		}()
	}
}
