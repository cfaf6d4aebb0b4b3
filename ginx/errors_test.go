package ginx_test

import (
	"errors"
	"io"
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

// TestErrorsRenderedOutside: Gin's way with errors is c.Error in the
// handler and a middleware that renders c.Errors after c.Next. When that
// middleware is outside the guard, it writes after the guarded run ended:
// a handler that reported an error without answering has not answered.
// Its key is released and nothing stored, and the middleware's answer
// goes out; the retry runs the handler again. Stored, the run's 200
// without a body (what Gin holds when nothing was written) would be
// replayed to the retry of a request that failed: a failed charge
// answered as done.
func TestErrorsRenderedOutside(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) { // renders the errors the handlers reported
		c.Next()
		if len(c.Errors) > 0 {
			c.JSON(http.StatusBadGateway, gin.H{"error": c.Errors.Last().Error()})
		}
	})
	r.POST("/charges", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), func(c *gin.Context) {
		if runs.Add(1) == 1 {
			_ = c.Error(errors.New("bank unreachable"))
			return
		}
		c.String(http.StatusCreated, "charged")
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	post := func() (int, string, bool) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/charges", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k-1")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, res.Body)
		return res.StatusCode, b.String(), res.Header.Get(httpx.ReplayedHeader) == "true"
	}
	if code, body, replayed := post(); code != http.StatusBadGateway || body != `{"error":"bank unreachable"}` || replayed {
		t.Fatalf("failed run: %d %q replayed %v; want the middleware's 502", code, body, replayed)
	}
	if code, body, replayed := post(); code != http.StatusCreated || body != "charged" || replayed || runs.Load() != 2 {
		t.Fatalf("retry: %d %q replayed %v, runs %d; want the handler run again (201)", code, body, replayed, runs.Load())
	}
	if code, body, replayed := post(); code != http.StatusCreated || body != "charged" || !replayed || runs.Load() != 2 {
		t.Fatalf("after the charge: %d %q replayed %v, runs %d; want its replay", code, body, replayed, runs.Load())
	}
}
