package ginx_test

import (
	"net/http"
	"net/http/httptest"
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

// BenchmarkGuard: one Gin engine in process on real Redis: the unguarded
// handler (plain), a fresh key each request (guarded), and one key's
// replay (replay). The ratios guarded/plain and replay/plain are the
// guard's cost on Gin.
//
//	go test -run XXX -bench . -benchmem ./ginx/
func BenchmarkGuard(b *testing.B) {
	g := guardenv.Guard(b, guard.Options{})
	r := gin.New()
	h := func(c *gin.Context) {
		c.Data(http.StatusCreated, "application/json", []byte(`{"id":"ch_1","amount":500}`))
	}
	r.POST("/plain", h)
	r.POST("/guarded", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), h)
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
					r.ServeHTTP(w, req)
					if w.Code != http.StatusCreated {
						b.Fatalf("%d %s", w.Code, w.Body)
					}
				}
			})
		})
	}
}
