package ginx_test

import (
	"io"
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

// TestGroupAndRouteGuard: a group's guard and a route's own, of one
// guard.Guard, on the same request: the handler runs once, under the
// group's claim, and the retry is replayed. The route's guard used to
// meet the group's claim as a request in flight, and its 409 was stored
// as the key's answer: the handler never ran.
func TestGroupAndRouteGuard(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	idem := ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}})
	r := gin.New()
	api := r.Group("/api", idem)
	api.POST("/orders", idem, func(c *gin.Context) {
		runs.Add(1)
		c.String(http.StatusCreated, "placed")
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	for i := range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/orders", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "nest-1")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if replayed := res.Header.Get(httpx.ReplayedHeader) == "true"; res.StatusCode != http.StatusCreated || string(body) != "placed" || replayed != (i == 1) {
			t.Fatalf("request %d: %d %q replayed %v", i+1, res.StatusCode, body, replayed)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
