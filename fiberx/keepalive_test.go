package fiberx_test

import (
	"bytes"
	"fmt"
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

// TestBuffersReusedOnKeepAlive: fasthttp reuses a connection's request
// and response buffers for its next request as soon as the handlers
// return. Many requests on a few keep-alive connections, each answered
// with its own body, key and a header field from its request, are stored
// before their buffers are reused: every replay is its first response,
// byte for byte.
func TestBuffersReusedOnKeepAlive(t *testing.T) {
	g := guardenv.Guard(t, guard.Options{})
	app := newApp()
	app.Post("/echo", fiberx.Guard(g, fiberx.Options{Options: httpx.Options{SingleCaller: true}}), func(c fiber.Ctx) error {
		c.Response().Header.SetBytesV("X-Echo", c.Request().Header.Peek("X-Tag")) // fasthttp's bytes, not a copy
		c.Response().Header.SetBytesV("X-Key", c.Request().Header.Peek(httpx.DefaultHeader))
		return c.Status(http.StatusCreated).Send(c.Body())
	})
	base := listen(t, app)
	tr := &http.Transport{MaxConnsPerHost: 3, MaxIdleConnsPerHost: 3}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	const n = 300
	type reply struct {
		status int
		echo   string
		key    string
		body   []byte
	}
	call := func(i int) (reply, error) {
		body := strings.Repeat(fmt.Sprintf("body-%03d;", i), 1+i%40)
		req, _ := http.NewRequest(http.MethodPost, base+"/echo", strings.NewReader(body))
		req.Header.Set(httpx.DefaultHeader, fmt.Sprintf("key-%03d", i))
		req.Header.Set("X-Tag", fmt.Sprintf("tag-%03d-%s", i, strings.Repeat("x", i%17)))
		res, err := client.Do(req)
		if err != nil {
			return reply{}, err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return reply{res.StatusCode, res.Header.Get("X-Echo"), res.Header.Get("X-Key"), b}, err
	}
	round := func() []reply {
		out := make([]reply, n)
		var wg sync.WaitGroup
		for w := range 6 {
			wg.Go(func() {
				for i := w; i < n; i += 6 {
					r, err := call(i)
					if err != nil {
						t.Error(err)
						return
					}
					out[i] = r
				}
			})
		}
		wg.Wait()
		return out
	}
	first, again := round(), round()
	for i := range n {
		want := reply{http.StatusCreated, fmt.Sprintf("tag-%03d-%s", i, strings.Repeat("x", i%17)), fmt.Sprintf("key-%03d", i),
			[]byte(strings.Repeat(fmt.Sprintf("body-%03d;", i), 1+i%40))}
		for name, r := range map[string]reply{"first": first[i], "replay": again[i]} {
			if r.status != want.status || r.echo != want.echo || r.key != want.key || !bytes.Equal(r.body, want.body) {
				t.Fatalf("request %d, %s: %d %q %q %q, want %q %q %q", i, name, r.status, r.echo, r.key, r.body, want.echo, want.key, want.body)
			}
		}
	}
}
