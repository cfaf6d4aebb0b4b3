package httpx_test

import (
	"net/http"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// A handler that sets a field net/http does not send (an empty name, as
// from a header name left unset in configuration; a name with a space):
// the first answer goes out without it, and its replay is that answer. The
// field was stored, and every replay of the key was a 500 "stored
// response unreadable" for the whole TTL.
func TestFieldNetHTTPDropsIsNotStored(t *testing.T) {
	e := newEnv(t, guard.Options{})
	runs := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.Header().Set("", "req-1")
		w.Header()["X Request"] = []string{"req-1"}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"order":1}`))
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	first := do(t, c, "POST", srv.URL+"/orders", `{"sku":"a"}`, key("empty-name")...)
	if first.status != http.StatusCreated || string(first.body) != `{"order":1}` {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	second := do(t, c, "POST", srv.URL+"/orders", `{"sku":"a"}`, key("empty-name")...)
	if second.status != first.status || string(second.body) != string(first.body) || !second.replayed() {
		t.Fatalf("replay: %d %q (replayed %v), want the first answer %d %q replayed (handler ran %d times)",
			second.status, second.body, second.replayed(), first.status, first.body, runs)
	}
}
