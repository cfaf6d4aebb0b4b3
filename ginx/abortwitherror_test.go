package ginx_test

import (
	"errors"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestAbortWithErrorRenderer pins what README.md says of
// c.AbortWithError and an error renderer. AbortWithError writes its
// status at once (AbortWithStatus), without a body: the handler chose
// that answer, perhaps after its effect (a 402 for a card the bank
// declined), so it is stored, not released. A renderer outside the guard
// adds its body after the guarded run was stored: the first client gets
// it, the retry gets the status replayed without it. A renderer after
// the guard (between it and the handler) writes inside the run: its body
// is stored and replayed. The handler runs once either way.
func TestAbortWithErrorRenderer(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	render := func(c *gin.Context) {
		c.Next()
		if len(c.Errors) > 0 {
			c.JSON(-1, gin.H{"error": c.Errors.Last().Error()}) // -1: the status the handler chose
		}
	}
	h := func(c *gin.Context) {
		runs.Add(1)
		_ = c.AbortWithError(http.StatusPaymentRequired, errors.New("card declined"))
	}
	opts := ginx.Options{Options: httpx.Options{SingleCaller: true}}
	r := gin.New()
	r.POST("/outside", render, ginx.Guard(g, opts), h)
	r.POST("/inside", ginx.Guard(g, opts), render, h)
	const body = `{"error":"card declined"}`
	for _, tc := range []struct {
		path, retryBody string
	}{{"/outside", ""}, {"/inside", body}} {
		before := runs.Load()
		if w := post(t, r, tc.path, "k"+tc.path, "{}"); w.Code != http.StatusPaymentRequired || w.Body.String() != body {
			t.Fatalf("%s first: %d %q", tc.path, w.Code, w.Body)
		}
		w := post(t, r, tc.path, "k"+tc.path, "{}")
		if w.Code != http.StatusPaymentRequired || w.Body.String() != tc.retryBody || w.Header().Get(httpx.ReplayedHeader) != "true" {
			t.Fatalf("%s retry: %d %q %v; want 402 %q replayed", tc.path, w.Code, w.Body, w.Header(), tc.retryBody)
		}
		if n := runs.Load() - before; n != 1 {
			t.Fatalf("%s: %d runs, want 1", tc.path, n)
		}
	}
}
