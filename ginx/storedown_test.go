package ginx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestClientThroughStoreOutage: a Gin payment API on a Redis of the
// test's own, called through httpx.NewClient while that Redis is down.
// The guard answers 503 with Retry-After (nothing run); the client keeps
// the key and asks again; once Redis is back the charge runs once and
// the client gets it, and sending the call again with the key the client
// made replays it.
func TestClientThroughStoreOutage(t *testing.T) {
	srv := testenv.StartRedis(t)
	g := guard.New(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), guard.Options{})
	var runs atomic.Int64
	unavailable := make(chan struct{})
	var once sync.Once
	r := gin.New()
	r.Use(func(c *gin.Context) {
		c.Next()
		if c.Writer.Status() == http.StatusServiceUnavailable {
			once.Do(func() { close(unavailable) })
		}
	})
	r.POST("/charges", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), func(c *gin.Context) {
		runs.Add(1)
		c.String(http.StatusCreated, "charged")
	})
	api := httptest.NewServer(r)
	defer api.Close()
	client := httpx.NewClient(httpx.TransportOptions{MaxAttempts: 20, BaseDelay: 10 * time.Millisecond})
	defer client.CloseIdleConnections()

	srv.Kill()
	type result struct {
		code     int
		body     string
		key      string
		replayed bool
		err      error
	}
	call := func(key string) result {
		req, _ := http.NewRequest(http.MethodPost, api.URL+"/charges", strings.NewReader(`{"amount":100}`))
		if key != "" {
			req.Header.Set(httpx.DefaultHeader, key)
		}
		res, err := client.Do(req)
		if err != nil {
			return result{err: err}
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return result{res.StatusCode, string(b), res.Request.Header.Get(httpx.DefaultHeader), res.Header.Get(httpx.ReplayedHeader) == "true", nil}
	}
	done := make(chan result, 1)
	go func() { done <- call("") }()
	<-unavailable
	if n := runs.Load(); n != 0 {
		t.Fatalf("%d runs while the store was down", n)
	}
	srv.Restart()
	first := <-done
	if first.err != nil || first.code != http.StatusCreated || first.body != "charged" || first.replayed {
		t.Fatalf("call: %+v; want 201 charged", first)
	}
	again := call(first.key)
	if again.err != nil || again.code != http.StatusCreated || !again.replayed {
		t.Fatalf("the call sent again with its key: %+v; want its replay", again)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs %d, want 1", n)
	}
}
