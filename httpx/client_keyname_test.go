package httpx_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestOwnKeyUnderLowerCaseName: a request that carries its own key
// under a header map entry spelled in lower case (req.Header["idempotency-key"],
// as code that copies a map[string]string of headers, or an HTTP/2
// peer's field names, sets it) is a request with a key: the Transport must
// not add a second, fresh one. It looks the field up by its canonical
// name only, finds none, and sends both: the server sees two
// Idempotency-Key fields, which a Guard answers 400 ("2 Idempotency-Key
// fields; send exactly one"), and the caller's own key is never honoured.
func TestOwnKeyUnderLowerCaseName(t *testing.T) {
	var mu sync.Mutex
	var seen [][]string
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Values("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
	req.Header["idempotency-key"] = []string{"order-42"}
	resp, err := retryClient(t, httpx.TransportOptions{}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || len(seen[0]) != 1 || seen[0][0] != "order-42" {
		t.Fatalf("server saw Idempotency-Key fields %q; want exactly [order-42]", seen)
	}
}

// TestOwnKeyUnderLowerCaseNameGuarded: the same request against a
// Guard: the caller set its key, and the Guard answers 400 (two
// Idempotency-Key fields) instead of running the handler once.
func TestOwnKeyUnderLowerCaseNameGuarded(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int32
	h := httpx.Guard(e.g, httpx.Options{SingleCaller: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv, _ := serve(t, h)
	req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader(`{"amount":100}`))
	req.Header["idempotency-key"] = []string{"order-42"}
	resp, err := retryClient(t, httpx.TransportOptions{}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || runs.Load() != 1 {
		t.Fatalf("%d %s, handler ran %d times; want 201 from one run under the caller's key", resp.StatusCode, b, runs.Load())
	}
}
