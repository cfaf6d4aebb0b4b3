package fiberx_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestRedisOutOfMemory: a Fiber app on a Redis of its own that runs out of
// memory (maxmemory, noeviction) while a charge runs. The charge that
// holds its key completes all the same and its retry is replayed; a key
// completed before is replayed; a new key is answered 503 with
// Retry-After, its handler not run (docs/design.md, out of memory).
func TestRedisOutOfMemory(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	rc := srv.Client()
	g := guard.New(guardenv.StoreOn(t, rc, guard.RedisOptions{}), guard.Options{})
	var runs atomic.Int64
	running, release := make(chan struct{}), make(chan struct{})
	app := fiber.New()
	app.Post("/charges", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		runs.Add(1)
		if c.Get("X-Block") != "" {
			close(running)
			<-release
		}
		return c.Status(http.StatusCreated).SendString("charged " + c.Get(httpx.DefaultHeader))
	})
	post := func(key string, header ...string) *http.Response {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("{}"))
		req.Header.Set(httpx.DefaultHeader, key)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := app.Test(req, testConfig)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = res.Body.Close() })
		return res
	}
	if res := post("before"); res.StatusCode != http.StatusCreated {
		t.Fatalf("before the OOM: %d", res.StatusCode)
	}
	held := make(chan *http.Response, 1)
	go func() { held <- post("held", "X-Block", "1") }()
	<-running
	// Out of memory: a limit far below what the server holds. (Filling
	// the server up to a limit does not keep it there: as it frees its
	// clients' buffers it comes back under the limit, and a claim sent
	// then is taken.)
	ctx := context.Background()
	if err := rc.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
		t.Fatalf("a write on the full server: %v, want OOM", err)
	}
	close(release)
	if res := <-held; res.StatusCode != http.StatusCreated {
		t.Fatalf("the charge under way: %d", res.StatusCode)
	}
	for _, tc := range []struct {
		key      string
		status   int
		replayed bool
	}{{"held", http.StatusCreated, true}, {"before", http.StatusCreated, true}, {"new", http.StatusServiceUnavailable, false}} {
		res := post(tc.key)
		if res.StatusCode != tc.status || (res.Header.Get(httpx.ReplayedHeader) == "true") != tc.replayed {
			t.Fatalf("%s: %d replayed %q; want %d replayed %v", tc.key, res.StatusCode, res.Header.Get(httpx.ReplayedHeader), tc.status, tc.replayed)
		}
		if tc.status == http.StatusServiceUnavailable && res.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: 503 without Retry-After", tc.key)
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("runs %d, want 2 (before, held)", n)
	}
}
