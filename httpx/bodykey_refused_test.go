package httpx_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// orderDesk is a handler keyed by a field of the JSON body, as a service
// behind httpx.KeyFromBody is: it decodes the body with json.Decoder into
// a struct, places an order under the id it read there (order_id,
// meta.ref, items[0].ref or id, the ones present), and answers 201; a
// body it cannot decode gets its own 400.
type orderDesk struct {
	mu     sync.Mutex
	placed map[string]int // orders by the id the handler decoded
}

func newOrderDesk() *orderDesk { return &orderDesk{placed: map[string]int{}} }

func (d *orderDesk) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var in struct {
		OrderID string `json:"order_id"`
		ID      string `json:"id"`
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
	id := in.OrderID + in.ID + in.Meta.Ref
	if len(in.Items) > 0 {
		id += in.Items[0].Ref
	}
	d.mu.Lock()
	d.placed[id]++
	d.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
}

// orders returns the orders placed so far, by id.
func (d *orderDesk) orders() map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.placed)
}

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
			h := newOrderDesk()
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
			if placed := h.orders(); placed["o-1"] != 1 || len(placed) != 1 {
				t.Fatalf("orders placed by the id the handler read: %v; want o-1 once", placed)
			}
		})
	}
}

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
	h := newOrderDesk()
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
	if placed := h.orders(); placed["o-1"] != 1 || placed["o-2"] != 1 || placed["o-3"] != 1 || len(placed) != 3 {
		t.Fatalf("orders placed by the id the handler read: %v; want o-1, o-2 and o-3 once each", placed)
	}
}

// TestBodyKeyNotUnicode: a key read from the JSON body (KeyFromBody)
// that is not valid Unicode (raw bytes that are not UTF-8, such as a
// Latin-1 "é", or a lone surrogate escape such as "\ud800") was decoded by
// encoding/json into U+FFFD and kept as that. Two orders whose keys differ
// ("caf\xe9" and "caf\xe8"; "\ud800" and "\udbff") then shared the key
// "caf\uFFFD" (or "\uFFFD"): the second order was answered 422 as a reuse
// of the first's key and never ran. Each such body must get 400
// (ProblemMalformedKey), as a header key outside visible ASCII does, and
// nothing runs; a key spelled with a valid escape ("\u00e9", a surrogate
// pair) is unaffected.
func TestBodyKeyNotUnicode(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := newOrderDesk()
	srv, c := serve(t, httpx.Guard(e.g, httpx.Options{SingleCaller: true, Key: httpx.KeyFromBody("/id"), Logger: testenv.Logger(t)})(h))
	for _, body := range []string{
		"{\"id\":\"caf\xe9\",\"amount\":1}",
		"{\"id\":\"caf\xe8\",\"amount\":2}",
		`{"id":"\ud800","amount":3}`,
		`{"id":"\udbff","amount":4}`,
		`{"id":"x\udc00y","amount":5}`,
	} {
		r := do(t, c, "POST", srv.URL+"/orders", body, jsonCT()...)
		if r.status != http.StatusBadRequest || r.problem(t).Type != httpx.ProblemMalformedKey {
			t.Errorf("%q: %d %s; want 400 %s", body, r.status, r.body, httpx.ProblemMalformedKey)
		}
	}
	for _, body := range []string{`{"id":"caf\u00e9","amount":1}`, `{"id":"\ud83d\ude00","amount":2}`, "{\"id\":\"caf\u00e8\",\"amount\":3}"} {
		if r := do(t, c, "POST", srv.URL+"/orders", body, jsonCT()...); r.status != http.StatusCreated {
			t.Errorf("%s: %d %s; want 201", body, r.status, r.body)
		}
	}
	if placed := h.orders(); len(placed) != 3 {
		t.Errorf("orders placed: %v; want 3, by the valid keys only", placed)
	}
}

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
	h := newOrderDesk()
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
	if placed := h.orders(); placed["o-1"] != 1 || len(placed) != 1 {
		t.Fatalf("orders placed by the id the handler read: %v; want o-1 once", placed)
	}
}
