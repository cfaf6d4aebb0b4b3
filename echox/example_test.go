package echox_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/echox"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// An Echo route whose handler charges once per Idempotency-Key and
// caller; the retry gets the stored response.
func ExampleGuard() {
	mr, _ := miniredis.Run() // a real Redis in production
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	e := echo.New()
	auth := func(next echo.HandlerFunc) echo.HandlerFunc { // your authentication
		return func(c echo.Context) error { c.Set("account", "acct_1"); return next(c) }
	}
	charges := 0
	e.POST("/charges", func(c echo.Context) error {
		lease, _, _ := echox.ClaimFrom(c) // lease.Fence for downstream writes
		charges++
		return c.JSON(http.StatusCreated, map[string]any{"charge": charges, "fence": lease.Fence})
	}, auth, echox.Guard(g, echox.Options{
		Tenant: func(c echo.Context) string { s, _ := c.Get("account").(string); return s },
	}))

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, strings.TrimSpace(w.Body.String()), "replayed:", w.Header().Get(httpx.ReplayedHeader) == "true")
	}
	fmt.Println("charges:", charges)
	// Output:
	// 201 {"charge":1,"fence":1} replayed: false
	// 201 {"charge":1,"fence":1} replayed: true
	// charges: 1
}
