package httpx_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestMethodSpelling: a request whose method is a guarded one spelled in
// another case ("patch", as browsers' fetch sends it: it upper-cases only
// DELETE, GET, HEAD, OPTIONS, POST and PUT) reaches a handler registered
// without a method as that method would; the Guard guards it too, under
// its key, rather than letting every copy run unguarded.
func TestMethodSpelling(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/items/{id}", guarded(e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "updated %d", runs.Add(1))
	}), httpx.Options{}))
	srv, c := serve(t, mux)
	for _, m := range []string{"patch", "Post"} {
		first := do(t, c, m, srv.URL+"/items/1", "a", key("spelled-"+m)...)
		again := do(t, c, m, srv.URL+"/items/1", "a", key("spelled-"+m)...)
		if first.status != http.StatusOK || first.replayed() || !again.replayed() || string(again.body) != string(first.body) {
			t.Fatalf("%s: first %d %q, again %d %q replayed %v; want the replay", m, first.status, first.body, again.status, again.body, again.replayed())
		}
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (once per key)", n)
	}
	// Safe methods stay untouched, however spelled.
	if r := do(t, c, "get", srv.URL+"/items/1", "", key("spelled-get")...); r.replayed() || runs.Load() != 3 {
		t.Fatalf("get: replayed %v, runs %d", r.replayed(), runs.Load())
	}
}

// TestMethodSpellingOneScope: a retry that spells the guarded method
// otherwise than its first request ("PATCH", then "patch") reaches the
// same handler, so it is under the same key's scope: it is not run a
// second time (the fingerprint, which keeps the method as sent, tells
// the two apart: 422).
func TestMethodSpellingOneScope(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/items/{id}", guarded(e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "updated %d", runs.Add(1))
	}), httpx.Options{}))
	srv, c := serve(t, mux)
	first := do(t, c, "PATCH", srv.URL+"/items/1", "a", key("one-scope")...)
	again := do(t, c, "patch", srv.URL+"/items/1", "a", key("one-scope")...)
	if first.status != http.StatusOK || runs.Load() != 1 {
		t.Fatalf("first %d %q, runs %d", first.status, first.body, runs.Load())
	}
	if again.status != http.StatusUnprocessableEntity {
		t.Fatalf("patch after PATCH under one key: %d %q (runs %d), want 422", again.status, again.body, runs.Load())
	}
}

// TestMethodSpellingComputedKey: the same with a ComputedKey, which the
// client does not choose: a copy of a request that spells the guarded
// method otherwise ("PATCH", then "patch", same path and body) reaches
// the same handler, so it gets the same key and is not run a second time
// (422, as with a header key).
func TestMethodSpellingComputedKey(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("/items/{id}", guarded(e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "updated %d", runs.Add(1))
	}), httpx.Options{Key: httpx.ComputedKey()}))
	srv, c := serve(t, mux)
	first := do(t, c, "PATCH", srv.URL+"/items/1", "a")
	if first.status != http.StatusOK || runs.Load() != 1 {
		t.Fatalf("first %d %q, runs %d", first.status, first.body, runs.Load())
	}
	again := do(t, c, "patch", srv.URL+"/items/1", "a")
	if again.status != http.StatusUnprocessableEntity || runs.Load() != 1 {
		t.Fatalf("patch after PATCH, same request: %d %q, handler ran %d times; want 422 and once", again.status, again.body, runs.Load())
	}
}
