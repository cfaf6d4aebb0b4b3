package echox_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemguard/idemguard/echox"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// BenchmarkGuard: one Echo instance in process on real Redis: the
// unguarded handler (plain), a fresh key each request (guarded), and one
// key's replay (replay).
//
//	go test -run XXX -bench . -benchmem ./echox/
func BenchmarkGuard(b *testing.B) {
	g := guardenv.Guard(b, guard.Options{})
	e := newEcho()
	h := func(c echo.Context) error {
		return c.Blob(http.StatusCreated, "application/json", []byte(`{"id":"ch_1","amount":500}`))
	}
	e.POST("/plain", h)
	e.POST("/guarded", h, echox.Guard(g, echox.Options{Options: httpx.Options{SingleCaller: true}}))
	var n atomic.Int64
	for _, bc := range []struct{ name, path, key string }{{"plain", "/plain", ""}, {"guarded", "/guarded", ""}, {"replay", "/guarded", "replayed"}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(32) // 64 workers on 2 cores, as httpx's BenchmarkGuard: the guard's round trips overlap
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req := httptest.NewRequest(http.MethodPost, bc.path, strings.NewReader(`{"amount":500}`))
					req.Header.Set("Content-Type", "application/json")
					k := bc.key
					if k == "" {
						k = "k" + strconv.FormatInt(n.Add(1), 10)
					}
					req.Header.Set(httpx.DefaultHeader, k)
					w := httptest.NewRecorder()
					e.ServeHTTP(w, req)
					if w.Code != http.StatusCreated {
						b.Fatalf("%d %s", w.Code, w.Body)
					}
				}
			})
		})
	}
}
