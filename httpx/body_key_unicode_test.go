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
	var mu sync.Mutex
	ran := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			ID     string `json:"id"`
			Amount int    `json:"amount"`
		}
		_ = json.NewDecoder(r.Body).Decode(&in)
		mu.Lock()
		ran++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})
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
	mu.Lock()
	defer mu.Unlock()
	if ran != 3 {
		t.Errorf("handler ran %d times; want 3 (the valid keys only)", ran)
	}
}
