package ginx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/conformance"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	goleak.VerifyTestMain(m)
}

// handler runs a conformance handler as a Gin handler.
func handler(h conformance.Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		body, err := io.ReadAll(c.Request.Body)
		if err != nil {
			c.String(http.StatusBadRequest, err.Error())
			return
		}
		lease, _, claimed := ginx.ClaimFrom(c)
		resp := h(c.Request.Context(), conformance.Req{Method: c.Request.Method, Path: c.Request.URL.Path, Body: body,
			Header: c.Request.Header, Claimed: claimed, Lease: lease})
		if resp.Switch != nil {
			switchProtocols(c, resp)
			return
		}
		for k, vs := range resp.Header {
			for _, v := range vs {
				c.Writer.Header().Add(k, v)
			}
		}
		c.Data(resp.Status, resp.Header.Get("Content-Type"), resp.Body)
	}
}

// switchProtocols answers resp's 101 (if it has one) and runs its session
// on the connection, as coder/websocket does on Gin (WriteHeaderNow: Gin
// holds a status until the body) or gorilla/websocket (the 101 written
// on the connection).
func switchProtocols(c *gin.Context, resp conformance.Resp) {
	for k, vs := range resp.Header {
		for _, v := range vs {
			c.Writer.Header().Add(k, v)
		}
	}
	if resp.Status != 0 {
		c.Writer.WriteHeader(resp.Status)
		c.Writer.WriteHeaderNow()
	}
	conn, brw, err := c.Writer.Hijack()
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	resp.Switch(brw)
}

// server serves h behind ginx.Guard on a Gin engine, for the shared
// conformance suite.
func server(t testing.TB, g *guard.Guard, opts httpx.Options, h conformance.Handler) string {
	return serverWith(t, g, ginx.Options{Options: opts}, h)
}

func serverWith(t testing.TB, g *guard.Guard, opts ginx.Options, h conformance.Handler) string {
	r := gin.New()
	var n atomic.Int64
	r.Use(func(c *gin.Context) { // outer middleware
		c.Header("X-Request-Id", strconv.FormatInt(n.Add(1), 10))
		c.Next()
	})
	guarded := r.Group("/", ginx.Guard(g, opts))
	guarded.Any("/charges", handler(h))
	guarded.Any("/storm", handler(h))
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestConformance(t *testing.T) { conformance.Run(t, server) }

func TestConformanceUpgrade(t *testing.T) {
	conformance.RunUpgrade(t, server, conformance.UpgradeOptions{})
}

// TestStorm: 1,000 keys × 8 copies over two Gin servers on one Redis,
// each key's effect exactly once.
func TestStorm(t *testing.T) { t.Log(conformance.Storm(t, server, 1000, 8)) }
