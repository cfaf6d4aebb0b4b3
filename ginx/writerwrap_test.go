package ginx_test

import (
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// bodyLogWriter is the common Gin pattern for a middleware that sees the
// response: it wraps c.Writer and does not put it back.
type bodyLogWriter struct{ gin.ResponseWriter }

// TestWrappedWriterStatusOnly: a middleware inside the guard that
// wraps c.Writer (a body logger, gin-contrib/gzip) is not Gin's
// HandleContext. A handler behind it that answers with a status only
// (c.Status(202)) must get that status to the client, stored and
// replayed, as it was before the HandleContext detection.
func TestWrappedWriterStatusOnly(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.POST("/jobs",
		ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}),
		func(c *gin.Context) {
			c.Writer = &bodyLogWriter{ResponseWriter: c.Writer}
			c.Next()
		},
		func(c *gin.Context) {
			runs.Add(1)
			c.Status(http.StatusAccepted)
		})
	first := post(t, r, "/jobs", "wrap-1", "{}")
	if first.Code != http.StatusAccepted {
		t.Errorf("first: %d %q, want 202", first.Code, first.Body)
	}
	retry := post(t, r, "/jobs", "wrap-1", "{}")
	if retry.Code != http.StatusAccepted || retry.Body.Len() != 0 || runs.Load() != 1 {
		t.Errorf("retry: %d %q (replayed %q), want the first's empty 202 replayed; handler ran %d times",
			retry.Code, retry.Body, retry.Header().Get(httpx.ReplayedHeader), runs.Load())
	}
}
