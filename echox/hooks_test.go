package echox_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
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

// TestOuterHooksNotStored: a field that middleware outside the guard
// adds in a Before hook of Echo's Response (when the status goes out) is
// that middleware's, as a field an outer net/http wrapper adds around
// httpx.Guard is: not stored as the handler's, so a replay carries the
// new request's value once, not the first request's beside it. The
// handler's own hook is the handler's: stored and replayed. Outer
// middleware still sees the status and size that went out; the handler
// sees a Response as Echo gives it (Status 200 before it writes).
func TestOuterHooksNotStored(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs, hooks atomic.Int64
	var status, size, handlerSaw []int
	e := newEcho()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			c.Response().Before(func() {
				c.Response().Header().Add("X-Served", "s"+strconv.FormatInt(hooks.Add(1), 10))
			})
			err := next(c)
			status, size = append(status, c.Response().Status), append(size, int(c.Response().Size))
			return err
		}
	})
	guarded := e.Group("", echox.Guard(g, echox.Options{Options: httpx.Options{SingleCaller: true}}))
	guarded.POST("/pay", func(c echo.Context) error {
		handlerSaw = append(handlerSaw, c.Response().Status)
		n := strconv.FormatInt(runs.Add(1), 10)
		c.Response().Before(func() { c.Response().Header().Set("X-Run", n) })
		return c.String(http.StatusCreated, "run "+n)
	})
	guarded.POST("/refuse", func(c echo.Context) error {
		runs.Add(1)
		return echo.NewHTTPError(http.StatusConflict, "taken")
	})
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	do := func(path string) (int, http.Header, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader("{}"))
		req.Header.Set(httpx.DefaultHeader, "k"+path)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, string(b)
	}
	for _, path := range []string{"/pay", "/refuse"} {
		hooks.Store(0)
		c1, h1, b1 := do(path)
		c2, h2, b2 := do(path)
		if c1 != c2 || b1 != b2 || h2.Get(httpx.ReplayedHeader) != "true" {
			t.Fatalf("%s: first %d %q, replay %d %q %v", path, c1, b1, c2, b2, h2)
		}
		if !slices.Equal(h1["X-Served"], []string{"s1"}) || !slices.Equal(h2["X-Served"], []string{"s2"}) {
			t.Errorf("%s: outer hook's field: first %q, replay %q; want [s1], [s2]", path, h1["X-Served"], h2["X-Served"])
		}
		if path == "/pay" && (h1.Get("X-Run") != "1" || h2.Get("X-Run") != "1") {
			t.Errorf("handler's hook's field: first %q, replay %q; want 1 both", h1.Get("X-Run"), h2.Get("X-Run"))
		}
	}
	if want := []int{201, 201, 409, 409}; !slices.Equal(status, want) {
		t.Errorf("outer middleware saw statuses %v, want %v", status, want)
	}
	if size[0] != len("run 1") || size[1] != len("run 1") || size[2] == 0 || size[2] != size[3] {
		t.Errorf("outer middleware saw sizes %v", size)
	}
	if !slices.Equal(handlerSaw, []int{http.StatusOK}) {
		t.Errorf("the handler saw Response.Status %v before writing, want [200] as unguarded", handlerSaw)
	}
	if runs.Load() != 2 {
		t.Errorf("handlers ran %d times, want 2", runs.Load())
	}
}
