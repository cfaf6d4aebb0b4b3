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

// TestBodyKeyDuplicateMember: encoding/json does not let the
// last of two members with one name replace the first when the later one
// is an object, an array or null: it decodes an object into the struct
// (or map) the first one filled, an array into the elements the first
// one made, and null into a struct or string as nothing, so the earlier
// member's key survives. The guard took the last member alone, found no
// key there, and with Optional ran the request unguarded: a body such as
// {"meta":{"ref":"o-1"},"meta":{}} placed order o-1 again on every
// delivery, while the handler read o-1 as its key. A body with the key's
// member (or one on its path) more than once is refused, 400
// (ProblemMalformedKey), with Optional too, and the handler does not run.
func TestBodyKeyDuplicateMember(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var mu sync.Mutex
	placed := map[string]int{} // orders by the id the handler decoded
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			OrderID string `json:"order_id"`
			Meta    struct {
				Ref string `json:"ref"`
			} `json:"meta"`
			Items []struct {
				Ref string `json:"ref"`
			} `json:"items"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		id := in.OrderID + in.Meta.Ref
		if len(in.Items) > 0 {
			id += in.Items[0].Ref
		}
		mu.Lock()
		placed[id]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
	routes := map[string]string{}
	var c *http.Client
	for _, ptr := range []string{"/order_id", "/meta/ref", "/items/0/ref"} {
		s, cl := serve(t, httpx.Guard(e.g, httpx.Options{SingleCaller: true, Optional: true, Key: httpx.KeyFromBody(ptr), Logger: testenv.Logger(t)})(h))
		c, routes[ptr] = cl, s.URL
	}
	first := map[string]string{
		"/order_id":    `{"order_id":"o-1"}`,
		"/meta/ref":    `{"meta":{"ref":"o-2"}}`,
		"/items/0/ref": `{"items":[{"ref":"o-3"}]}`,
	}
	for ptr, body := range first {
		if r := do(t, c, "POST", routes[ptr]+"/orders", body, jsonCT()...); r.status != http.StatusCreated {
			t.Fatalf("%s first: %d %s", ptr, r.status, r.body)
		}
	}
	for _, tc := range []struct{ ptr, body string }{
		{"/order_id", `{"order_id":"o-1","order_id":null}`},
		{"/meta/ref", `{"meta":{"ref":"o-2"},"meta":{}}`},
		{"/meta/ref", `{"meta":{"ref":"o-2"},"meta":null}`},
		{"/meta/ref", `{"meta":{"ref":"o-2"},"meta":{"note":"x"}}`},
		{"/items/0/ref", `{"items":[{"ref":"o-3"}],"items":[{}]}`},
	} {
		r := do(t, c, "POST", routes[tc.ptr]+"/orders", tc.body, jsonCT()...)
		if r.status != http.StatusBadRequest || r.problem(t).Type != httpx.ProblemMalformedKey {
			t.Errorf("%s: %d %s; want 400 malformed key", tc.body, r.status, r.body)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if placed["o-1"] != 1 || placed["o-2"] != 1 || placed["o-3"] != 1 || len(placed) != 3 {
		t.Fatalf("orders placed by the id the handler read: %v; want o-1, o-2 and o-3 once each", placed)
	}
}
