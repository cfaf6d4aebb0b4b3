package fiberx_test

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/valyala/fasthttp"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// BenchmarkGuard: one Fiber app in process (its fasthttp handler called
// with a request context, no network) on real Redis: the unguarded
// handler (plain), a fresh key each request (guarded), and one key's
// replay (replay).
//
//	go test -run XXX -bench . -benchmem ./fiberx/
func BenchmarkGuard(b *testing.B) {
	g := guardenv.Guard(b, guard.Options{})
	app := newApp()
	h := func(c fiber.Ctx) error {
		c.Set("Content-Type", "application/json")
		return c.Status(http.StatusCreated).Send([]byte(`{"id":"ch_1","amount":500}`))
	}
	app.Post("/plain", h)
	app.Post("/guarded", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), h)
	handler := app.Handler()
	var n atomic.Int64
	for _, bc := range []struct{ name, path, key string }{{"plain", "/plain", ""}, {"guarded", "/guarded", ""}, {"replay", "/guarded", "replayed"}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(32) // 64 workers on 2 cores, as httpx's BenchmarkGuard: the guard's round trips overlap
			b.RunParallel(func(pb *testing.PB) {
				var req fasthttp.Request
				var ctx fasthttp.RequestCtx
				for pb.Next() {
					req.Reset()
					req.Header.SetMethod(http.MethodPost)
					req.SetRequestURI(bc.path)
					req.Header.SetContentType("application/json")
					req.SetBodyString(`{"amount":500}`)
					k := bc.key
					if k == "" {
						k = "k" + strconv.FormatInt(n.Add(1), 10)
					}
					req.Header.Set(httpx.DefaultHeader, k)
					ctx.Init(&req, nil, nil)
					handler(&ctx)
					if ctx.Response.StatusCode() != http.StatusCreated {
						b.Fatalf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
					}
				}
			})
		})
	}
}
