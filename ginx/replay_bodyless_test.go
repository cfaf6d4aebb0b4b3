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

type replayAnswer struct {
	code   int
	body   string
	header http.Header
}

func replayPost(t *testing.T, url, key string) replayAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("{}"))
	req.Header.Set(httpx.DefaultHeader, key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return replayAnswer{res.StatusCode, string(b), res.Header}
}

// TestNoRouteReplayIsFirstAnswer: with the guard engine-wide (r.Use), as
// TestNoRouteKeepsStatus sets it up, a POST no route matches gets Gin's
// 404 "404 page not found" (text/plain), and so does its replay (405
// likewise). Gin's serveError writes its default body after the guard
// returned, while the status Gin's writer holds is unwritten; the replay
// wrote an empty body, which made Gin send its header at once, so
// serveError found the writer written and the replay had no body.
func TestNoRouteReplayIsFirstAnswer(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}))
	r.GET("/orders", func(c *gin.Context) { c.String(http.StatusOK, "list") })
	srv := httptest.NewServer(r)
	defer srv.Close()
	for _, path := range []string{"/nosuchroute", "/orders"} {
		first := replayPost(t, srv.URL+path, "k"+path)
		replay := replayPost(t, srv.URL+path, "k"+path)
		if replay.header.Get(httpx.ReplayedHeader) != "true" {
			t.Fatalf("%s: second call not a replay: %d %q %v", path, replay.code, replay.body, replay.header)
		}
		if first.code != replay.code || first.body != replay.body || first.header.Get("Content-Type") != replay.header.Get("Content-Type") {
			t.Errorf("%s: first %d %q (Content-Type %q), replay %d %q (Content-Type %q); want the replay to be the first answer",
				path, first.code, first.body, first.header.Get("Content-Type"), replay.code, replay.body, replay.header.Get("Content-Type"))
		}
	}
}

// TestBodylessReplayKeepsOuterField: Gin holds a status until a body, so
// middleware outside the guard that sets a field after c.Next (a timing
// or tracing header) has it sent with a guarded handler's bodyless answer
// (c.Status(201)), and with its replay: outer fields keep the new
// request's values on a replay (docs/design.md). The replay wrote its
// empty body, which sent Gin's header at once, without the field.
func TestBodylessReplayKeepsOuterField(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	var runs atomic.Int64
	r := gin.New()
	r.Use(func(c *gin.Context) { c.Next(); c.Header("X-Served-By", "api-1") })
	r.POST("/jobs", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), func(c *gin.Context) {
		runs.Add(1)
		c.Status(http.StatusCreated)
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	first := replayPost(t, srv.URL+"/jobs", "job-1")
	replay := replayPost(t, srv.URL+"/jobs", "job-1")
	if first.code != http.StatusCreated || first.header.Get("X-Served-By") != "api-1" {
		t.Fatalf("first: %d %v", first.code, first.header)
	}
	if replay.code != http.StatusCreated || replay.header.Get(httpx.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Fatalf("replay: %d %v, runs %d", replay.code, replay.header, runs.Load())
	}
	if got := replay.header.Get("X-Served-By"); got != "api-1" {
		t.Errorf("replay's X-Served-By %q, want %q as on the first answer (and as unguarded)", got, "api-1")
	}
}
