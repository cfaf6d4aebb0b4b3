package httpx_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/memstore"
)

// BenchmarkMiddleware measures the middleware's own work, one request at a
// time in process, on the in-memory store, so that neither a network nor
// Redis's client is in the figures: "plain" is the handler alone, "fresh"
// a new key each request (claim, capture, encode, complete), "replay" one
// completed key; "guard-fresh" and "guard-replay" are the guard calls the
// middleware makes, alone (Hold and Complete; Hold). fresh less plain and
// guard-fresh is the middleware's own cost for a new key; replay less
// guard-replay and the harness's two allocations (a replay does not run the
// handler, so plain's third, the handler's, is not in it) for a replay.
// Measured on the 2-core development machine: about 3 µs and 5
// allocations per new key (the body read, the fingerprint, the run, the
// request with its context, the encoded response) and 1.2 µs and 4 per
// replay (the body read, the fingerprint, the replayed fields' string and
// slice); TestMiddlewareAllocations bounds the allocations.
//
//	go test -run XXX -bench Middleware -benchmem ./httpx
func BenchmarkMiddleware(b *testing.B) {
	payload := []byte(`{"id":"ord_1","status":"created","amount":1000,"currency":"EUR"}`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(payload)
	})
	// newGuard is a guard on a new memstore (which keeps every key for
	// the TTL, so a long run starts over now and then) and the handler
	// behind the middleware on it, routed as an application would.
	newGuard := func() (*guard.Guard, http.Handler) {
		g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
		mux := http.NewServeMux()
		mux.Handle("POST /orders", httpx.Guard(g, httpx.Options{SingleCaller: true})(handler))
		return g, mux
	}
	plain := http.NewServeMux()
	plain.Handle("POST /orders", handler)
	const body = `{"sku":"tea","qty":1}`
	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	req.Header.Set("Content-Type", "application/json")
	rd := strings.NewReader(body)
	w := &discardWriter{h: http.Header{}}
	send := func(h http.Handler, key string) {
		rd.Reset(body)
		req.Body, req.ContentLength = io.NopCloser(rd), int64(len(body))
		req.Header["Idempotency-Key"] = []string{key}
		clear(w.h)
		w.status = 0
		h.ServeHTTP(w, req)
		if w.status != http.StatusCreated {
			b.Fatalf("status %d", w.status)
		}
	}
	keys := make([]string, 1<<16)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	fp := strings.Repeat("f", 64) // a fingerprint's shape
	result := []byte(strings.Repeat("r", 100))
	ctx := context.Background()

	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			send(plain, "plain")
		}
	})
	b.Run("fresh", func(b *testing.B) {
		_, h := newGuard()
		i := 0
		for b.Loop() {
			if i == len(keys) {
				_, h = newGuard()
				i = 0
			}
			send(h, keys[i])
			i++
		}
	})
	b.Run("replay", func(b *testing.B) {
		_, h := newGuard()
		send(h, "the-same-key")
		for b.Loop() {
			send(h, "the-same-key")
		}
	})
	b.Run("guard-fresh", func(b *testing.B) {
		g, _ := newGuard()
		i := 0
		for b.Loop() {
			if i == len(keys) {
				g, _ = newGuard()
				i = 0
			}
			out, held, err := g.Hold(ctx, guard.Key{Scope: "POST /orders", ID: keys[i]}, fp)
			if err != nil || out.Status != guard.Acquired {
				b.Fatal(out, err)
			}
			if err := held.Complete(result); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("guard-replay", func(b *testing.B) {
		g, _ := newGuard()
		done := guard.Key{Scope: "POST /orders", ID: "the-same-key"}
		_, held, err := g.Hold(ctx, done, fp)
		if err != nil {
			b.Fatal(err)
		}
		if err := held.Complete(result); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if out, _, err := g.Hold(ctx, done, fp); err != nil || out.Status != guard.Replay {
				b.Fatal(out, err)
			}
		}
	})
}

// discardWriter is an http.ResponseWriter that keeps the status and
// discards the body, so that the benchmark counts only the server side.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header { return w.h }

func (w *discardWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *discardWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(p), nil
}
