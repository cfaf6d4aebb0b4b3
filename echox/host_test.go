package echox_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idemguard/idemguard/echox"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestHostRoutersApart: Echo routes by host (e.Host) with a router per
// host, and c.Path() is the route's path alone. Two hosts' routes of the
// same path are two routes, and never share a key: the same key and body
// to POST /charges on each host runs each host's handler once (as a
// net/http ServeMux pattern with a host scopes by it). Host "b.test"'s
// handler never ran before the scope named the host: it got a replay of
// a.test's response.
func TestHostRoutersApart(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	for _, pre := range []bool{false, true} {
		e := newEcho()
		guarded := echox.Guard(g, echox.Options{Options: httpx.Options{SingleCaller: true}})
		if pre {
			e.Pre(guarded) // before routing: no route yet, the path is the scope
		} else {
			e.Use(guarded)
		}
		var runs [3]atomic.Int64
		for i, host := range []string{"a.test", "b.test"} {
			e.Host(host).POST("/charges", func(c echo.Context) error {
				runs[i].Add(1)
				return c.String(http.StatusCreated, "charged on "+host)
			})
		}
		e.POST("/charges", func(c echo.Context) error { // any other host
			runs[2].Add(1)
			return c.String(http.StatusCreated, "charged on the default router")
		})
		key := fmt.Sprint("k-pre-", pre)
		for round := range 2 {
			for i, host := range []string{"a.test", "b.test", "other.test"} {
				req := httptest.NewRequest(http.MethodPost, "http://"+host+"/charges", strings.NewReader("{}"))
				req.Header.Set(httpx.DefaultHeader, key)
				w := httptest.NewRecorder()
				e.ServeHTTP(w, req)
				if w.Code != http.StatusCreated {
					t.Fatalf("pre %v, round %d, %s: %d %s", pre, round, host, w.Code, w.Body)
				}
				if n := runs[i].Load(); n != 1 {
					t.Fatalf("pre %v, round %d, %s: handler ran %d times, want 1 (answer %q, replayed %q)",
						pre, round, host, n, w.Body, w.Header().Get(httpx.ReplayedHeader))
				}
			}
		}
		// Two paths of one host are two scopes (not one of the host alone):
		// the same key on another path runs, rather than answering 422.
		req := httptest.NewRequest(http.MethodPost, "http://a.test/refunds", strings.NewReader("{}"))
		req.Header.Set(httpx.DefaultHeader, key)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		if w.Code == http.StatusUnprocessableEntity {
			t.Fatalf("pre %v: a.test/refunds with a.test/charges's key: 422, its scope is the host's alone", pre)
		}
	}
}
