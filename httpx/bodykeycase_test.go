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

// TestBodyKeyCaseVariants: encoding/json decodes a member into a struct
// field whatever its case ("ORDER_ID" fills `json:"order_id"`, the last
// such member winning), so a body that names the key's member in another
// case is one whose key the handler reads otherwise than the guard would:
// {"order_id":"x","ORDER_ID":"o-1"} was guarded as key x and placed order
// o-1 a second time. Such a body is refused (400, malformed key), with
// Optional too, and the handler does not run.
func TestBodyKeyCaseVariants(t *testing.T) {
	for _, optional := range []bool{false, true} {
		name := map[bool]string{false: "required", true: "optional"}[optional]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			var mu sync.Mutex
			placed := map[string]int{} // orders by the id the handler decoded
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var in struct {
					OrderID string `json:"order_id"`
					Meta    struct {
						Ref string `json:"ref"`
					} `json:"meta"`
				}
				if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				mu.Lock()
				placed[in.OrderID+in.Meta.Ref]++
				mu.Unlock()
				w.WriteHeader(http.StatusCreated)
			})
			opts := httpx.Options{SingleCaller: true, Optional: optional, Key: httpx.KeyFromBody("/order_id"), Logger: testenv.Logger(t)}
			srv, c := serve(t, httpx.Guard(e.g, opts)(h))
			nested := httpx.Options{SingleCaller: true, Optional: optional, Key: httpx.KeyFromBody("/meta/ref"), Logger: testenv.Logger(t)}
			srvNested, _ := serve(t, httpx.Guard(e.g, nested)(h))

			if r := do(t, c, "POST", srv.URL+"/orders", `{"order_id":"o-1"}`, jsonCT()...); r.status != http.StatusCreated {
				t.Fatalf("first: %d %s", r.status, r.body)
			}
			for _, tc := range []struct{ url, body string }{
				{srv.URL, `{"order_id":"x","ORDER_ID":"o-1"}`},
				{srv.URL, `{"ORDER_ID":"o-1","order_id":"y"}`},
				{srv.URL, `{"Order_Id":"o-1"}`},
				{srvNested.URL, `{"meta":{"ref":"r-1","REF":"o-1"}}`},
				{srvNested.URL, `{"META":{"ref":"o-1"},"meta":{"ref":"r-2"}}`},
			} {
				r := do(t, c, "POST", tc.url+"/orders", tc.body, jsonCT()...)
				if r.status != http.StatusBadRequest || r.problem(t).Type != httpx.ProblemMalformedKey {
					t.Errorf("%s: %d %s, want 400 malformed key", tc.body, r.status, r.body)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if placed["o-1"] != 1 || len(placed) != 1 {
				t.Fatalf("orders placed by the id the handler read: %v; want o-1 once", placed)
			}
		})
	}
}
