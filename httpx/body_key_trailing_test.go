package httpx_test

import (
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestBodyKeyTrailingBytes: with KeyFromBody and Optional, a body
// that is not one JSON document runs unguarded, "as it has no key". But a
// JSON document followed by more bytes ({"order_id":"o-1"} x, or two
// documents one after the other) has a key for the handler that reads it
// with json.NewDecoder(r.Body).Decode, the usual way, which stops after
// the first value: every delivery of such a body placed order o-1 again.
// Such a body is refused (400, ProblemMalformedKey), with Optional too;
// a body that is no JSON at all still runs unguarded.
func TestBodyKeyTrailingBytes(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var mu sync.Mutex
	placed := map[string]int{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			OrderID string `json:"order_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		mu.Lock()
		placed[in.OrderID]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	srv, c := serve(t, httpx.Guard(e.g, httpx.Options{SingleCaller: true, Optional: true, Key: httpx.KeyFromBody("/order_id"), Logger: testenv.Logger(t)})(h))
	if r := do(t, c, "POST", srv.URL+"/orders", `{"order_id":"o-1"}`, jsonCT()...); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	for _, body := range []string{`{"order_id":"o-1"} x`, `{"order_id":"o-1"}{"order_id":"o-2"}`, `{"order_id":"o-1"}]`, "{\"order_id\":\"o-1\"}\n{"} {
		r := do(t, c, "POST", srv.URL+"/orders", body, jsonCT()...)
		if r.status != http.StatusBadRequest || r.problem(t).Type != httpx.ProblemMalformedKey {
			t.Errorf("%q: %d %s; want 400 malformed key", body, r.status, r.body)
		}
	}
	// No JSON at all: no key, run unguarded as documented (the handler
	// answers 400 itself).
	if r := do(t, c, "POST", srv.URL+"/orders", `order_id=o-1`, jsonCT()...); r.status != http.StatusBadRequest || r.header.Get("Content-Type") == httpx.ProblemContentType {
		t.Errorf("not JSON: %d %s; want the handler's own 400", r.status, r.body)
	}
	mu.Lock()
	defer mu.Unlock()
	if placed["o-1"] != 1 || len(placed) != 1 {
		t.Fatalf("orders placed by the id the handler read: %v; want o-1 once", placed)
	}
}
