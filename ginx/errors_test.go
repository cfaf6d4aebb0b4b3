package ginx_test

import (
	"errors"
	"io"
	"math"
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

// TestRenderFailedAfterEffect: a handler that made its effect and then
// failed to render its answer (c.JSON of a NaN: Gin records the error in
// c.Errors and writes no body) chose its status: that answer is the
// key's, as Gin sends it (a 200 without a body), stored and replayed,
// not taken for an error left to outside middleware, whose released key
// would have the retry make the effect again.
func TestRenderFailedAfterEffect(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.POST("/charges", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), func(c *gin.Context) {
		runs.Add(1)
		c.JSON(http.StatusOK, gin.H{"fee": math.NaN()})
	})
	for i := range 2 {
		w := post(t, r, "/charges", "k-1", "{}")
		if w.Code != http.StatusOK || w.Body.Len() != 0 || (w.Header().Get(httpx.ReplayedHeader) == "true") != (i == 1) {
			t.Fatalf("call %d: %d %q %v; want 200 without a body, replayed the second time", i+1, w.Code, w.Body, w.Header())
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d, want 1", runs.Load())
	}
}

// TestErrorsBeforeGuardNotTheRun's: an error middleware before the guard
// reported (c.Error, and went on: a deprecated field, a soft check) is
// not the guarded handlers'. A handler that made its effect and answered
// Gin's default 200 without writing has answered: stored and replayed,
// not taken for a failed run whose released key has the retry make the
// effect again (2 runs, each answered 500, before).
func TestErrorsBeforeGuardNotTheRun(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) {
		if c.GetHeader("X-Old-Client") != "" {
			_ = c.Error(errors.New("X-Old-Client is deprecated")).SetType(gin.ErrorTypePrivate)
		}
		c.Next()
	})
	r.POST("/webhooks", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), func(c *gin.Context) {
		runs.Add(1) // the effect; Gin answers 200
	})
	for i := range 2 {
		w := post(t, r, "/webhooks", "k-1", "{}", "X-Old-Client", "1")
		if w.Code != http.StatusOK || (w.Header().Get(httpx.ReplayedHeader) == "true") != (i == 1) {
			t.Fatalf("call %d: %d %q %v; want 200, replayed the second time", i+1, w.Code, w.Body, w.Header())
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("runs %d, want 1", runs.Load())
	}
}
