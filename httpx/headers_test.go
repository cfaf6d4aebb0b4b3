package httpx_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// outer is middleware outside the Guard that sets fields of its own on
// every response: a request id that differs per request, and a
// Cache-Control default the handler may override.
func outer(next http.Handler) http.Handler {
	var n atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req-"+strconv.FormatInt(n.Add(1), 10))
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Frame-Options", "DENY")
		next.ServeHTTP(w, r)
	})
}

// TestReplayHandlerSetOnly: a replay stores and replays the fields the
// handler set or changed; the outer middleware's fields carry their values
// of the moment.
func TestReplayHandlerSetOnly(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Order", "o-1")
		w.Header().Set("Cache-Control", "private") // overrides the outer default
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		w.WriteHeader(http.StatusCreated)
		w.Header().Set("X-After-Status", "late") // after WriteHeader: not part of the response
		_, _ = w.Write([]byte("made"))
	})
	srv, c := serve(t, outer(guarded(e, h, httpx.Options{})))
	first := do(t, c, "POST", srv.URL+"/o", "a", key("hs-1")...)
	second := do(t, c, "POST", srv.URL+"/o", "a", key("hs-1")...)
	if !second.replayed() || string(second.body) != "made" || second.status != http.StatusCreated {
		t.Fatalf("replay: %d replayed %v %q", second.status, second.replayed(), second.body)
	}
	if got := first.header.Get("X-Request-Id"); got != "req-1" {
		t.Fatalf("first X-Request-Id %q", got)
	}
	if got := second.header.Get("X-Request-Id"); got != "req-2" {
		t.Errorf("replayed X-Request-Id %q, want req-2 (the outer middleware's value now)", got)
	}
	for _, r := range []reply{first, second} {
		if r.header.Get("X-Order") != "o-1" || r.header.Get("Cache-Control") != "private" ||
			strings.Join(r.header.Values("X-Multi"), ",") != "a,b" || r.header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("header %v", r.header)
		}
		if r.header.Get("X-After-Status") != "" {
			t.Errorf("a field set after WriteHeader went out: %v", r.header)
		}
	}
}

// TestNeverStored: the fields of the never-stored list are not replayed,
// whatever they hold; ReplayHeader can keep the private ones, never the
// hop-by-hop ones. The middleware is called directly, since some of these
// fields change how net/http frames a response on the wire.
func TestNeverStored(t *testing.T) {
	never := map[string]string{
		"Set-Cookie": "session=secret", "Authentication-Info": `nextnonce="abc"`,
		"Proxy-Authentication-Info": `rspauth="x"`, "Connection": "X-Hop", "X-Hop": "1",
		"Keep-Alive": "timeout=5", "Proxy-Connection": "keep-alive", "Proxy-Authenticate": "Basic",
		"Proxy-Authorization": "Basic Zm9v", "Te": "trailers", "Trailer": "X-Sum", "Upgrade": "h2c",
		"Transfer-Encoding": "chunked", httpx.ReplayedHeader: "false",
	} // trailers are stored and replayed (TestTrailersReachClient)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range never {
			w.Header()[k] = []string{v}
		}
		w.Header().Set("X-Kept", "1")
		w.WriteHeader(http.StatusCreated)
	})
	private := map[string]bool{"Set-Cookie": true, "Authentication-Info": true, "Proxy-Authentication-Info": true}
	for _, tc := range []struct {
		name     string
		policy   func(string) bool
		keptPriv bool
	}{
		{"default", nil, false},
		{"keep everything", func(string) bool { return true }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, guard.Options{})
			mw := guarded(e, h, httpx.Options{ReplayHeader: tc.policy})
			for i := range 2 {
				req := httptest.NewRequest("POST", "/o", strings.NewReader("a"))
				req.Header.Set("Idempotency-Key", "ns-1")
				rec := httptest.NewRecorder()
				mw.ServeHTTP(rec, req)
				if i == 0 {
					continue
				}
				got := rec.Result().Header
				if got.Get(httpx.ReplayedHeader) != "true" || got.Get("X-Kept") != "1" {
					t.Fatalf("replay header %v", got)
				}
				for k := range never {
					if k == httpx.ReplayedHeader {
						continue
					}
					if _, there := got[k]; there != (private[k] && tc.keptPriv) {
						t.Errorf("%s replayed: %v", k, there)
					}
				}
			}
		})
	}
}

// TestPanicKeepsOuterHeader: after a panic the 500 carries the outer
// middleware's fields but none the handler set.
func TestPanicKeepsOuterHeader(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Half", "done")
		panic("boom")
	})
	srv, c := serve(t, outer(guarded(e, h, httpx.Options{})))
	r := do(t, c, "POST", srv.URL+"/o", "a", key("pk-1")...)
	if r.status != http.StatusInternalServerError || r.header.Get("X-Half") != "" || r.header.Get("X-Request-Id") != "req-1" {
		t.Fatalf("%d %v", r.status, r.header)
	}
}
