package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestXForwardedModes: what the upstream is told of the client in each
// x_forwarded mode, on a request passed through and on a guarded one:
// "set" names this hop's client alone, "append" adds it to the chain in
// front, "off" passes the client's fields untouched; the chain's
// standard field, Forwarded (RFC 7239), passes with "append" and "off".
// (Forwarded was dropped in every mode: httputil.ReverseProxy's Rewrite
// deletes it; found by review.)
func TestXForwardedModes(t *testing.T) {
	const fwd = `for=203.0.113.7;proto=https;host=shop.example.com`
	for _, tc := range []struct{ mode, xff, forwarded string }{
		{"set", "127.0.0.1", ""},
		{"append", "203.0.113.7, 127.0.0.1", fwd},
		{"off", "203.0.113.7", fwd},
	} {
		u := newUpstream(t)
		e := startGateway(t, basicConfig+"x_forwarded: "+tc.mode+"\n", u.URL)
		post(t, e.srv.URL+"/elsewhere", "", `{"order":"p"}`, "Forwarded", fwd, "X-Forwarded-For", "203.0.113.7")
		r := post(t, e.srv.URL+"/orders", "k-fwd-"+tc.mode, `{"order":"g"}`, "X-Account-Id", "acme", "Forwarded", fwd, "X-Forwarded-For", "203.0.113.7")
		if r.status != http.StatusCreated {
			t.Fatalf("%s: guarded POST: %d %q", tc.mode, r.status, r.body)
		}
		u.mu.Lock()
		hs := append([]http.Header(nil), u.headers...)
		u.mu.Unlock()
		if len(hs) != 2 {
			t.Fatalf("%s: the upstream got %d requests, want 2", tc.mode, len(hs))
		}
		for i, h := range hs {
			what := []string{"passed through", "guarded"}[i]
			if got := strings.Join(h.Values("X-Forwarded-For"), ", "); got != tc.xff {
				t.Errorf("x_forwarded: %s, %s: X-Forwarded-For %q, want %q", tc.mode, what, got, tc.xff)
			}
			if got := h.Get("Forwarded"); got != tc.forwarded {
				t.Errorf("x_forwarded: %s, %s: Forwarded %q, want %q", tc.mode, what, got, tc.forwarded)
			}
		}
	}
}
