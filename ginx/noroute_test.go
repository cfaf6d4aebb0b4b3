package ginx_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestNoRouteKeepsStatus: with the guard as engine-wide middleware
// (r.Use), Gin runs it for a request no route matches (404) or whose
// method the route does not serve (405, HandleMethodNotAllowed), with
// that status already set on its writer. The guard's writer starts from
// it, so the key stores and replays the 404 or 405, as under httpx.Guard
// around a ServeMux. (It started from 200: the client got, and every
// retry replayed, a 200 with an empty body, as if the request had
// succeeded.)
func TestNoRouteKeepsStatus(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}))
	r.GET("/orders", func(c *gin.Context) { c.String(http.StatusOK, "list") })
	for _, tc := range []struct {
		path string
		want int
	}{{"/nosuchroute", http.StatusNotFound}, {"/orders", http.StatusMethodNotAllowed}} {
		for i := range 2 {
			w := post(t, r, tc.path, "noroute"+tc.path, "{}")
			if w.Code != tc.want {
				t.Errorf("POST %s, call %d: %d %q (replayed %q); want %d", tc.path, i+1, w.Code, w.Body, w.Header().Get(httpx.ReplayedHeader), tc.want)
			}
		}
	}
}
