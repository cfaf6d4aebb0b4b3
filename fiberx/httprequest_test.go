package fiberx_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/gofiber/fiber/v3"

	"github.com/idemguard/idemguard/fiberx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestHTTPRequestOutlivesRequest: the *http.Request the funcs of
// httpx.Options (Tenant, Scope, Fingerprint) get is fasthttp's request
// converted; its strings must be its own, not views of fasthttp's
// buffers, which the next request on the connection overwrites. What
// Scope returns is kept past the request (the route's run times, for
// Retry-After), and so may be what a func returns from the request.
// After another request on the same keep-alive connection, what the
// funcs saw of the first is unchanged.
func TestHTTPRequestOutlivesRequest(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	type seen struct{ method, path, query, account, key string }
	var (
		mu  sync.Mutex
		got []seen
	)
	opts := httpx.Options{
		Tenant: func(r *http.Request) string { return r.Header.Get("X-Account") },
		Scope: func(r *http.Request) string {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("X-Account"), r.Header.Get(httpx.DefaultHeader)})
			return r.Method + " /orders"
		},
	}
	app := newApp()
	app.Post("/orders/:id", fiberx.Guard(g, fiberx.Options{Options: opts}), func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).SendString("ok")
	})
	base := listen(t, app)
	tr := &http.Transport{MaxConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	send := func(path, account, key string) {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader("{}"))
		req.Header.Set("X-Account", account)
		req.Header.Set(httpx.DefaultHeader, key)
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("%s: %d", path, res.StatusCode)
		}
	}
	send("/orders/aaaaaaaa?q=11111111", "acct-AAAAAAAA", "key-AAAAAAAA")
	send("/orders/bbbbbbbb?q=22222222", "acct-BBBBBBBB", "key-BBBBBBBB")
	mu.Lock()
	defer mu.Unlock()
	want := seen{"POST", "/orders/aaaaaaaa", "q=11111111", "acct-AAAAAAAA", "key-AAAAAAAA"}
	if len(got) != 2 || got[0] != want {
		t.Fatalf("what Scope saw of the first request, after the second: %+v; want %+v", got, want)
	}
}
