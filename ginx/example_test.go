package ginx_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// A Gin route whose handler charges once per Idempotency-Key and caller;
// the retry gets the stored response.
func ExampleGuard() {
	mr, _ := miniredis.Run() // a real Redis in production
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	auth := func(c *gin.Context) { c.Set("account", "acct_1") } // your authentication
	charges := 0
	r.POST("/charges", auth, ginx.Guard(g, ginx.Options{
		Tenant: func(c *gin.Context) string { return c.GetString("account") },
	}), func(c *gin.Context) {
		lease, _, _ := ginx.ClaimFrom(c) // lease.Fence for downstream writes
		charges++
		c.JSON(http.StatusCreated, gin.H{"charge": charges, "fence": lease.Fence})
	})

	for range 2 {
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get(httpx.ReplayedHeader) == "true")
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":1,"fence":1} replayed: false
	// 201 {"charge":1,"fence":1} replayed: true
	// charges: 1
}
