package httpx_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestTransportMethodSpelling: TransportOptions.Methods match a request's
// method in any case, as the Guard's Options.Methods do: a request made
// with "patch" (or "Post") gets a key and is retried with it as "PATCH"
// would be, and a method configured as "put" covers "PUT". Before, the
// match was exact: "patch" went out once, without a key, and a guarded
// route answered it 400 (missing key).
func TestTransportMethodSpelling(t *testing.T) {
	cases := []struct {
		methods []string // TransportOptions.Methods
		method  string   // the request's
		keyed   bool
	}{
		{nil, "patch", true},
		{nil, "Post", true},
		{nil, "PATCH", true},
		{nil, "get", false},
		{nil, "PUT", false},
		{[]string{"put"}, "PUT", true},
		{[]string{"put"}, "Put", true},
		{[]string{"put"}, "POST", false},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%v/%s", tc.methods, tc.method), func(t *testing.T) {
			s := &attemptServer{status: http.StatusServiceUnavailable, seen: make(chan string, 10)}
			srv, _ := serve(t, s)
			c := retryClient(t, httpx.TransportOptions{Methods: tc.methods, MaxAttempts: 3})
			req, _ := http.NewRequest(tc.method, srv.URL, strings.NewReader("x"))
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var keys []string
			for range s.attempts.Load() {
				keys = append(keys, <-s.seen)
			}
			if !tc.keyed {
				if len(keys) != 1 || keys[0] != "" {
					t.Fatalf("attempts' keys %q, want one attempt without a key", keys)
				}
				return
			}
			if len(keys) != 3 || keys[0] == "" || keys[1] != keys[0] || keys[2] != keys[0] {
				t.Fatalf("attempts' keys %q, want 3 attempts with one key", keys)
			}
		})
	}
}

// TestTransportMethodSpellingGuarded: through a Guard, a "patch" request
// sent by NewClient runs once and its retry is replayed, rather than being
// refused for want of a key.
func TestTransportMethodSpellingGuarded(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	srv, _ := serve(t, guarded(e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "updated %d", runs.Add(1))
	}), httpx.Options{}))
	c := retryClient(t, httpx.TransportOptions{})
	req, _ := http.NewRequest("patch", srv.URL+"/items/1", strings.NewReader("a"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "updated 1" {
		t.Fatalf("patch: %d %q, want 200 \"updated 1\"", resp.StatusCode, b)
	}
	k := resp.Request.Header.Get("Idempotency-Key")
	again := do(t, &http.Client{}, "patch", srv.URL+"/items/1", "a", key(k)...)
	if !again.replayed() || string(again.body) != "updated 1" || runs.Load() != 1 {
		t.Fatalf("the same key again: %d %q replayed %v, %d runs; want the replay, 1 run", again.status, again.body, again.replayed(), runs.Load())
	}
}
