package ginx_test

// The README's Gin snippet, verbatim (TestSnippetsInTests in internal/testenv checks that it
// still is), run.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/memstore"
)

func ExampleGuard_readme() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	auth := func(c *gin.Context) { c.Set("account", c.GetHeader("Authorization")) } // your authentication
	charges := 0
	charge := func(c *gin.Context) { charges++; c.String(http.StatusCreated, "charge %d", charges) }

	// Gin: go get github.com/idemguard/idemguard/ginx
	r.POST("/charges", auth, ginx.Guard(g, ginx.Options{
		Tenant: func(c *gin.Context) string { return c.GetString("account") },
	}), charge)

	for _, account := range []string{"acct_1", "acct_1", "acct_2"} {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Authorization", account)
		req.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(account, w.Code, w.Body.String(), "replayed:", w.Header().Get(httpx.ReplayedHeader) == "true")
	}
	// Output:
	// acct_1 201 charge 1 replayed: false
	// acct_1 201 charge 1 replayed: true
	// acct_2 201 charge 2 replayed: false
}
