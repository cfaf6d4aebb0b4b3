package ginx_test

import (
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestRecoveryTakesAbortHandler pins what a handler's
// panic(http.ErrAbortHandler) comes to under gin.Recovery outside the
// guard. The guard releases the key and panics on; Recovery takes the
// panic as a broken connection and aborts without writing, and Gin then
// sends what its writer holds, as it does without the guard: a 200 with
// no body (or the status and body the handler flushed, ended as if
// whole), not a connection cut off. Nothing is stored: a retry runs the
// handler again.
func TestRecoveryTakesAbortHandler(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, nil))
	opts := ginx.Options{Options: httpx.Options{SingleCaller: true}}
	r.POST("/abort", ginx.Guard(g, opts), func(c *gin.Context) {
		runs.Add(1)
		panic(http.ErrAbortHandler)
	})
	r.POST("/flushed", ginx.Guard(g, opts), func(c *gin.Context) {
		runs.Add(1)
		c.String(http.StatusCreated, "partial")
		c.Writer.Flush()
		panic(http.ErrAbortHandler)
	})
	for _, tc := range []struct {
		path string
		code int
		body string
	}{{"/abort", http.StatusOK, ""}, {"/flushed", http.StatusCreated, "partial"}} {
		before := runs.Load()
		for i := range 2 {
			w := post(t, r, tc.path, "k"+tc.path, "{}")
			if w.Code != tc.code || w.Body.String() != tc.body || w.Header().Get(httpx.ReplayedHeader) != "" {
				t.Fatalf("%s, call %d: %d %q %v; want %d %q, not replayed", tc.path, i+1, w.Code, w.Body, w.Header(), tc.code, tc.body)
			}
		}
		if n := runs.Load() - before; n != 2 {
			t.Fatalf("%s: handler ran %d times for two calls; want the key released, 2", tc.path, n)
		}
	}
}
