package httpx_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestClientEmptyHeaderKey: a request whose Idempotency-Key field is
// present but empty (req.Header.Set("Idempotency-Key", order.Key) with
// an order that has none; a proxy that copies the incoming field
// whether it is there or not) carries no key. The Transport took the
// empty field for the caller's key: it neither gave the request a key
// nor used its context's (WithIdempotencyKey, a step's key), and yet
// retried it as keyed. A service that reads an empty field as no key (a
// server testing r.Header.Get(...) != "") acted on each attempt: one
// call, two charges. idemguard's own Guard answered it 400
// malformed-key. connectx's client treats an empty field as none.
func TestClientEmptyHeaderKey(t *testing.T) {
	// A Stripe-like service: a request with a key acts once per key; one
	// without acts every time. The first answer of each call is lost
	// (503 after the effect, as a proxy that timed out would answer).
	type call struct{ key string }
	var mu sync.Mutex
	var seen []call
	effects := 0
	done := map[string]bool{}
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		seen = append(seen, call{key})
		first := len(seen) == 1
		if key == "" || !done[key] {
			effects++
			done[key] = key != ""
		}
		mu.Unlock()
		if first {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for _, tc := range []struct {
		name    string
		ctx     context.Context
		wantKey string // "" for any non-empty key
	}{
		{"no context key", context.Background(), ""},
		{"step key in the context", httpx.WithIdempotencyKey(context.Background(), "step-key-1"), "step-key-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			seen, effects, done = nil, 0, map[string]bool{}
			mu.Unlock()
			c := retryClient(t, httpx.TransportOptions{})
			req, _ := http.NewRequestWithContext(tc.ctx, "POST", srv.URL+"/charges", strings.NewReader("amount=100"))
			req.Header.Set("Idempotency-Key", "") // the order had no key
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			mu.Lock()
			defer mu.Unlock()
			if effects != 1 || len(seen) != 2 || seen[0].key == "" || seen[1].key != seen[0].key ||
				(tc.wantKey != "" && seen[0].key != tc.wantKey) {
				t.Fatalf("status %d, %d effects, keys sent %q; want one effect, two attempts with one non-empty key (%q)",
					resp.StatusCode, effects, seen, tc.wantKey)
			}
		})
	}
}

// TestClientEmptyHeaderKeyGuarded: behind httpx.Guard, a POST with an
// empty key field through NewClient was answered 400 malformed-key; the
// Transport, which gives a keyless POST its key, should give it one.
func TestClientEmptyHeaderKeyGuarded(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	srv, _ := serve(t, h)
	c := retryClient(t, httpx.TransportOptions{})
	req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("amount=100"))
	req.Header.Set("Idempotency-Key", "")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("%d %s; want 201 under a key of the Transport's", resp.StatusCode, b)
	}
}
