package echox_test

// The README's Echo snippet, verbatim (TestSnippetsInTests in internal/testenv checks that it
// still is), run.

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idemguard/idemguard/echox"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/memstore"
)

func ExampleGuard_readme() {
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	e := echo.New()
	auth := func(next echo.HandlerFunc) echo.HandlerFunc { // your authentication
		return func(c echo.Context) error { c.Set("account", c.Request().Header.Get("Authorization")); return next(c) }
	}
	charges := 0
	charge := func(c echo.Context) error {
		charges++
		return c.String(http.StatusCreated, fmt.Sprint("charge ", charges))
	}

	// Echo: go get github.com/idemguard/idemguard/echox
	e.POST("/charges", charge, auth, echox.Guard(g, echox.Options{
		Tenant: func(c echo.Context) string { s, _ := c.Get("account").(string); return s },
	}))

	for _, account := range []string{"acct_1", "acct_1", "acct_2"} {
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":500}`))
		req.Header.Set("Authorization", account)
		req.Header.Set("Idempotency-Key", "order-42")
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(account, w.Code, w.Body.String(), "replayed:", w.Header().Get(httpx.ReplayedHeader) == "true")
	}
	// Output:
	// acct_1 201 charge 1 replayed: false
	// acct_1 201 charge 1 replayed: true
	// acct_2 201 charge 2 replayed: false
}
