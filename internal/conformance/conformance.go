// Package conformance is the HTTP conformance suite every binding of the
// shared core runs: net/http (httpx), Gin (ginx), Echo (echox) and Fiber
// (fiberx). A binding's test gives Run (and Storm) a constructor that
// serves a framework-neutral Handler behind its guard middleware; the
// suite then checks, over real HTTP and a real Redis, the behaviours
// httpx.Guard documents: replays byte for byte with the marker, 422 on
// reuse, 409 with Retry-After in flight, 400 for missing and malformed
// keys, 5xx and panics releasing the key, 413, waiting, callers kept
// apart, 503 when the store is down, outer middleware's fields live on a
// replay, a replay that is the first response with the marker (a body-less
// response, a field with an empty value), and the claim visible to the
// handler. RunUpgrade checks a handler that switches protocols (a
// WebSocket), for bindings whose test server can take the connection
// (Resp.Switch).
package conformance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// Req is what a Handler sees of a request.
type Req struct {
	Method string
	Path   string
	Body   []byte
	Header http.Header
	// Claimed, Lease: what the binding's ClaimFrom returned in the
	// handler.
	Claimed bool
	Lease   guard.Lease
}

// Resp is what a Handler answers. Header fields are set on the response
// (Set, not Add; several values are added in order).
type Resp struct {
	Status int
	Header http.Header
	Body   []byte
	// Switch, if set, switches protocols (a WebSocket): the binding's
	// server takes the connection from its framework and runs Switch on
	// it, then closes it. With Status 101 the framework first answers
	// 101 Switching Protocols with Header, the way a handler does on it
	// (coder/websocket, fasthttp/websocket); with Status 0 the binding
	// takes the connection without answering, and Switch writes the 101
	// itself (gorilla/websocket, httputil.ReverseProxy). Only servers
	// given to RunUpgrade need to support it.
	Switch func(rw *bufio.ReadWriter)
}

// Handler is a framework-neutral handler: the binding's server calls it
// from its framework's handler, with the request's context, and writes
// its Resp with the framework's own calls. A Handler that panics must
// panic inside the framework's handler.
type Handler func(ctx context.Context, r Req) Resp

// NewServer starts a server of the binding under test: h behind the
// binding's guard middleware built from g and opts, behind an outer
// middleware that sets "X-Request-Id" to a number it increments per
// request (before the guard). It returns the server's base URL and stops
// the server when the test ends.
type NewServer func(t testing.TB, g *guard.Guard, opts httpx.Options, h Handler) (url string)

// reply is a response as the client got it.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) problem(t testing.TB) httpx.Problem {
	t.Helper()
	var p httpx.Problem
	if ct := r.header.Get("Content-Type"); ct != httpx.ProblemContentType {
		t.Fatalf("status %d, Content-Type %q, want a problem: %s", r.status, ct, r.body)
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	return p
}

// client sends requests to a server.
type client struct {
	t    testing.TB
	base string
	c    *http.Client
}

func newClient(t testing.TB, base string) *client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{t: t, base: base, c: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// do sends method path with body and header pairs ("Name", "value", ...).
func (c *client) do(method, path, body string, header ...string) reply {
	c.t.Helper()
	r, err := c.try(context.Background(), method, path, body, header...)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func (c *client) try(ctx context.Context, method, path, body string, header ...string) (reply, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	res, err := c.c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: res.StatusCode, header: res.Header, body: b}, nil
}

const key = httpx.DefaultHeader

// charge is the suite's usual handler: it counts its runs and answers 201
// with a body naming the run, header fields of its own, a cookie (never
// replayed) and the fence it ran under.
type charge struct {
	runs atomic.Int64
}

func (h *charge) handle(_ context.Context, r Req) Resp {
	n := h.runs.Add(1)
	return Resp{Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "X-Charge": {"ch_" + strconv.FormatInt(n, 10)},
			"X-Multi": {"a", "b"}, "Set-Cookie": {"session=secret"}, "X-Fence": {strconv.FormatInt(r.Lease.Fence, 10)}},
		Body: fmt.Appendf(nil, `{"charge":"ch_%d","claimed":%t,"body":%q}`, n, r.Claimed, r.Body)}
}

// Run runs the conformance suite against the binding newServer starts.
func Run(t *testing.T, newServer NewServer) {
	// single is a single caller's options, logging to t.Log (some
	// subtests provoke errors on purpose).
	single := func(t testing.TB) httpx.Options { return httpx.Options{SingleCaller: true, Logger: testenv.Logger(t)} }

	t.Run("ReplayByteForByte", func(t *testing.T) {
		h := &charge{}
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), single(t), h.handle))
		first := c.do("POST", "/charges", `{"amount":500}`, key, "k1")
		if first.status != http.StatusCreated || first.header.Get("X-Charge") != "ch_1" || first.header.Get(httpx.ReplayedHeader) != "" {
			t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
		}
		if !bytes.Contains(first.body, []byte(`"claimed":true`)) || first.header.Get("X-Fence") != "1" {
			t.Fatalf("the handler did not see its claim (ClaimFrom): %s, fence %q", first.body, first.header.Get("X-Fence"))
		}
		if first.header.Get("Set-Cookie") == "" {
			t.Fatal("the first response lost its cookie")
		}
		second := c.do("POST", "/charges", `{"amount":500}`, key, "k1")
		if h.runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", h.runs.Load())
		}
		if second.status != first.status || !bytes.Equal(second.body, first.body) {
			t.Fatalf("replay %d %q, want %d %q", second.status, second.body, first.status, first.body)
		}
		if second.header.Get(httpx.ReplayedHeader) != "true" {
			t.Fatalf("replay without %s: true: %v", httpx.ReplayedHeader, second.header)
		}
		for _, f := range []string{"Content-Type", "X-Charge", "X-Fence"} {
			if second.header.Get(f) != first.header.Get(f) {
				t.Errorf("replay %s %q, want %q", f, second.header.Get(f), first.header.Get(f))
			}
		}
		if got := second.header.Values("X-Multi"); strings.Join(got, ",") != "a,b" {
			t.Errorf("replay X-Multi %q, want [a b]", got)
		}
		if second.header.Get("Set-Cookie") != "" {
			t.Errorf("replay carries Set-Cookie %q", second.header.Get("Set-Cookie"))
		}
		// Outer middleware's field is not the handler's: the replay has
		// its value of the moment.
		if a, b := first.header.Get("X-Request-Id"), second.header.Get("X-Request-Id"); a == "" || b == "" || a == b {
			t.Errorf("X-Request-Id first %q, replay %q: want the outer middleware's current value", a, b)
		}
		// Another key runs again.
		if third := c.do("POST", "/charges", `{"amount":500}`, key, "k2"); third.header.Get("X-Charge") != "ch_2" {
			t.Fatalf("another key: %d %v", third.status, third.header)
		}
	})

	// The replay is the first response with the marker: every field the
	// client got (Content-Type and Content-Length present or not, a
	// field with an empty value), status and body; the outer
	// middleware's X-Request-Id, unless the handler set it, has its
	// value of the moment.
	t.Run("ReplayAsFirst", func(t *testing.T) {
		cases := map[string]Resp{
			"empty value": {Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}, "X-Empty": {""}},
				Body: []byte(`{}`)},
			"outer field emptied": {Status: http.StatusCreated, Header: http.Header{"Content-Type": {"text/plain"}, "X-Request-Id": {""}},
				Body: []byte("x")},
			"204":                 {Status: http.StatusNoContent},
			"201 without body":    {Status: http.StatusCreated},
			"typed, without body": {Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}},
		}
		for name, resp := range cases {
			t.Run(name, func(t *testing.T) {
				var runs atomic.Int64
				handler := func(context.Context, Req) Resp { runs.Add(1); return resp }
				c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), single(t), handler))
				first := c.do("POST", "/charges", `{}`, key, "af")
				replay := c.do("POST", "/charges", `{}`, key, "af")
				if runs.Load() != 1 || replay.header.Get(httpx.ReplayedHeader) != "true" {
					t.Fatalf("handler ran %d times; replay %v", runs.Load(), replay.header)
				}
				seen := func(r reply) http.Header {
					h := r.header.Clone()
					h.Del("Date")
					h.Del(httpx.ReplayedHeader)
					if _, set := resp.Header["X-Request-Id"]; !set {
						h.Del("X-Request-Id")
					}
					return h
				}
				if a, b := seen(first), seen(replay); first.status != replay.status || !bytes.Equal(first.body, replay.body) ||
					fmt.Sprint(a) != fmt.Sprint(b) {
					t.Fatalf("replay %d %v %q\nfirst  %d %v %q", replay.status, b, replay.body, first.status, a, first.body)
				}
			})
		}
	})

	t.Run("ReuseWithAnotherBody422", func(t *testing.T) {
		h := &charge{}
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), single(t), h.handle))
		c.do("POST", "/charges", `{"amount":500}`, key, "k")
		r := c.do("POST", "/charges", `{"amount":900}`, key, "k")
		if r.status != http.StatusUnprocessableEntity || r.problem(t).Type != httpx.ProblemKeyMismatch {
			t.Fatalf("reuse: %d %s", r.status, r.body)
		}
		if bytes.Contains(r.body, []byte("ch_1")) {
			t.Fatal("a mismatch revealed the stored response")
		}
		if h.runs.Load() != 1 {
			t.Fatalf("handler ran %d times", h.runs.Load())
		}
	})

	t.Run("BadKeys400", func(t *testing.T) {
		h := &charge{}
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), single(t), h.handle))
		cases := []struct {
			name   string
			header []string
			typ    string
		}{
			{"missing", nil, httpx.ProblemMissingKey},
			{"empty", []string{key, ""}, httpx.ProblemMalformedKey},
			{"unterminated string", []string{key, `"abc`}, httpx.ProblemMalformedKey},
			{"space inside", []string{key, "a b"}, httpx.ProblemMalformedKey},
			{"too long", []string{key, strings.Repeat("k", httpx.MaxKeyLen+1)}, httpx.ProblemMalformedKey},
			{"two fields", []string{key, "a", key, "b"}, httpx.ProblemMalformedKey},
		}
		for _, tc := range cases {
			r := c.do("POST", "/charges", `{}`, tc.header...)
			if r.status != http.StatusBadRequest || r.problem(t).Type != tc.typ {
				t.Errorf("%s: %d %s, want 400 %s", tc.name, r.status, r.body, tc.typ)
			}
		}
		// A quoted structured-field string is the same key as the token.
		if r := c.do("POST", "/charges", `{}`, key, `"same"`); r.status != http.StatusCreated {
			t.Fatalf("quoted key: %d %s", r.status, r.body)
		}
		if r := c.do("POST", "/charges", `{}`, key, `same`); r.header.Get(httpx.ReplayedHeader) != "true" {
			t.Fatalf("bare key after the quoted one: %d %v", r.status, r.header)
		}
		if h.runs.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", h.runs.Load())
		}
		// Safe methods pass untouched, without a key.
		if r := c.do("GET", "/charges", ""); r.status != http.StatusCreated || r.header.Get(httpx.ReplayedHeader) != "" ||
			!bytes.Contains(r.body, []byte(`"claimed":false`)) {
			t.Fatalf("GET: %d %s", r.status, r.body)
		}
	})

	t.Run("InFlight409RetryAfter", func(t *testing.T) {
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		h := &charge{}
		handler := func(ctx context.Context, r Req) Resp {
			once.Do(func() { close(started) })
			<-release
			return h.handle(ctx, r)
		}
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), single(t), handler))
		done := make(chan reply, 1)
		go func() {
			r, err := c.try(context.Background(), "POST", "/charges", `{}`, key, "slow")
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		<-started
		r := c.do("POST", "/charges", `{}`, key, "slow")
		close(release)
		if r.status != http.StatusConflict || r.problem(t).Type != httpx.ProblemInFlight {
			t.Fatalf("duplicate in flight: %d %s", r.status, r.body)
		}
		if s, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || s < 1 || s > 30 {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
		if first := <-done; first.status != http.StatusCreated {
			t.Fatalf("first: %d %s", first.status, first.body)
		}
		if again := c.do("POST", "/charges", `{}`, key, "slow"); again.header.Get(httpx.ReplayedHeader) != "true" || h.runs.Load() != 1 {
			t.Fatalf("after the first finished: %d %v, runs %d", again.status, again.header, h.runs.Load())
		}
	})

	t.Run("Wait", func(t *testing.T) {
		started, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		h := &charge{}
		handler := func(ctx context.Context, r Req) Resp {
			once.Do(func() { close(started) })
			<-release
			return h.handle(ctx, r)
		}
		opts := single(t)
		opts.Wait = 20 * time.Second
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), opts, handler))
		done := make(chan reply, 1)
		go func() {
			r, _ := c.try(context.Background(), "POST", "/charges", `{}`, key, "w")
			done <- r
		}()
		<-started
		waiter := make(chan reply, 1)
		go func() {
			r, err := c.try(context.Background(), "POST", "/charges", `{}`, key, "w")
			if err != nil {
				t.Error(err)
			}
			waiter <- r
		}()
		// The duplicate is waiting (it has not answered); let the first
		// finish. Whether it arrived before or after, it must get the
		// replay, never a 409.
		select {
		case r := <-waiter:
			t.Fatalf("the duplicate answered before the first finished: %d %s", r.status, r.body)
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		first, dup := <-done, <-waiter
		if dup.status != http.StatusCreated || dup.header.Get(httpx.ReplayedHeader) != "true" || !bytes.Equal(dup.body, first.body) {
			t.Fatalf("waiting duplicate: %d %v %s; first %s", dup.status, dup.header, dup.body, first.body)
		}
		if h.runs.Load() != 1 {
			t.Fatalf("handler ran %d times", h.runs.Load())
		}
	})

	t.Run("5xxReleases", func(t *testing.T) {
		var runs atomic.Int64
		handler := func(_ context.Context, r Req) Resp {
			if runs.Add(1) == 1 {
				return Resp{Status: http.StatusBadGateway, Body: []byte("upstream down")}
			}
			return Resp{Status: http.StatusCreated, Body: []byte("ok")}
		}
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), single(t), handler))
		if r := c.do("POST", "/charges", `{}`, key, "k"); r.status != http.StatusBadGateway || string(r.body) != "upstream down" {
			t.Fatalf("first: %d %s", r.status, r.body)
		}
		if r := c.do("POST", "/charges", `{}`, key, "k"); r.status != http.StatusCreated || r.header.Get(httpx.ReplayedHeader) != "" {
			t.Fatalf("retry after a 5xx: %d %v %s, want the handler run again", r.status, r.header, r.body)
		}
		if r := c.do("POST", "/charges", `{}`, key, "k"); r.status != http.StatusCreated || r.header.Get(httpx.ReplayedHeader) != "true" {
			t.Fatalf("third: %d %v", r.status, r.header)
		}
		if runs.Load() != 2 {
			t.Fatalf("handler ran %d times, want 2", runs.Load())
		}
	})

	t.Run("PanicReleases", func(t *testing.T) {
		var runs atomic.Int64
		handler := func(_ context.Context, r Req) Resp {
			if runs.Add(1) == 1 {
				panic("boom")
			}
			return Resp{Status: http.StatusCreated, Body: []byte("ok")}
		}
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), single(t), handler))
		r := c.do("POST", "/charges", `{}`, key, "k")
		if r.status != http.StatusInternalServerError || r.problem(t).Type != httpx.ProblemHandlerPanic {
			t.Fatalf("panic: %d %s", r.status, r.body)
		}
		if r := c.do("POST", "/charges", `{}`, key, "k"); r.status != http.StatusCreated || r.header.Get(httpx.ReplayedHeader) != "" {
			t.Fatalf("retry after a panic: %d %s", r.status, r.body)
		}
		if runs.Load() != 2 {
			t.Fatalf("handler ran %d times, want 2", runs.Load())
		}
	})

	t.Run("Oversize413", func(t *testing.T) {
		h := &charge{}
		opts := single(t)
		opts.MaxBody = 64
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), opts, h.handle))
		r := c.do("POST", "/charges", strings.Repeat("x", 65), key, "big")
		if r.status != http.StatusRequestEntityTooLarge || r.problem(t).Type != httpx.ProblemBodyTooLarge {
			t.Fatalf("oversize: %d %s", r.status, r.body)
		}
		if r := c.do("POST", "/charges", strings.Repeat("x", 64), key, "big"); r.status != http.StatusCreated {
			t.Fatalf("at the limit, same key (nothing was stored before): %d %s", r.status, r.body)
		}
		if !bytes.Contains(c.do("POST", "/charges", strings.Repeat("x", 64), key, "big").body, []byte(strings.Repeat("x", 64))) {
			t.Fatal("the handler did not get the whole body")
		}
		if h.runs.Load() != 1 {
			t.Fatalf("handler ran %d times", h.runs.Load())
		}
	})

	t.Run("CallersApart", func(t *testing.T) {
		h := &charge{}
		opts := httpx.Options{Logger: testenv.Logger(t), Tenant: func(r *http.Request) string { return r.Header.Get("X-Tenant") }}
		c := newClient(t, newServer(t, guardenv.Guard(t, guard.Options{}), opts, h.handle))
		a := c.do("POST", "/charges", `{}`, key, "k", "X-Tenant", "alice")
		b := c.do("POST", "/charges", `{}`, key, "k", "X-Tenant", "bob")
		if a.header.Get("X-Charge") != "ch_1" || b.header.Get("X-Charge") != "ch_2" || b.header.Get(httpx.ReplayedHeader) != "" {
			t.Fatalf("two callers, one key: alice %v, bob %v", a.header, b.header)
		}
		if again := c.do("POST", "/charges", `{}`, key, "k", "X-Tenant", "alice"); again.header.Get("X-Charge") != "ch_1" ||
			again.header.Get(httpx.ReplayedHeader) != "true" {
			t.Fatalf("alice again: %v", again.header)
		}
		if r := c.do("POST", "/charges", `{}`, key, "k"); r.status != http.StatusUnauthorized || r.problem(t).Type != httpx.ProblemCallerUnknown {
			t.Fatalf("no caller: %d %s", r.status, r.body)
		}
	})

	t.Run("StoreDown503", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)), MaxRetries: -1,
			DialTimeout: 100 * time.Millisecond})
		t.Cleanup(func() { _ = rdb.Close() })
		g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: testenv.Prefix(t)}), guard.Options{})
		h := &charge{}
		c := newClient(t, newServer(t, g, single(t), h.handle))
		r := c.do("POST", "/charges", `{}`, key, "k")
		if r.status != http.StatusServiceUnavailable || r.problem(t).Type != httpx.ProblemStoreUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("store down: %d %v %s", r.status, r.header, r.body)
		}
		if h.runs.Load() != 0 {
			t.Fatal("the handler ran without a claim")
		}
	})
}
