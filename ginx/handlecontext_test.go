package ginx_test

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestHandleContextForwardIsStored: a guarded handler that forwards the
// request to another route with Gin's documented internal redirect
// (c.Request.URL.Path = ...; r.HandleContext(c)) answers with that
// route's response; the retry must be replayed that response (or, if the
// guard could not see its body, a "response not kept" marker with its
// status), never something else. HandleContext resets c.Writer to Gin's
// own writer, so the response goes around the guard's capture, and the
// guard stored a 200 with an empty body: the retry read success without
// the order.
func TestHandleContextForwardIsStored(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.POST("/v1/orders", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), func(c *gin.Context) {
		c.Request.URL.Path = "/v2/orders"
		r.HandleContext(c)
	})
	r.POST("/v2/orders", func(c *gin.Context) {
		c.String(http.StatusCreated, "order "+strconv.FormatInt(runs.Add(1), 10))
	})
	first := post(t, r, "/v1/orders", "fwd-1", "{}")
	if first.Code != http.StatusCreated || first.Body.String() != "order 1" {
		t.Fatalf("first: %d %q", first.Code, first.Body)
	}
	retry := post(t, r, "/v1/orders", "fwd-1", "{}")
	replayed := retry.Body.String() == "order 1" || strings.Contains(retry.Body.String(), "response-not-kept")
	if retry.Code != http.StatusCreated || !replayed || retry.Header().Get(httpx.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Errorf("retry: %d %q (replayed %q), want the first's 201 replayed (or marked not kept); handler ran %d times",
			retry.Code, retry.Body, retry.Header().Get(httpx.ReplayedHeader), runs.Load())
	}
}
