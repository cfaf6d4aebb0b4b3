package httpx_test

import (
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestTrailersReachClient: a handler that declares a trailer and sets it
// after its body (net/http's way), or names one with http.TrailerPrefix,
// sends it through the Guard as it would without it, and a replay sends
// the same trailers. The capture restored the header of the status line
// when it let the response go, and dropped the trailers set after it; the
// stored response kept none.
func TestTrailersReachClient(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "body")
		w.Header().Set("X-Sum", "declared")
		w.Header().Set(http.TrailerPrefix+"X-Late", "undeclared")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	for i, want := range []bool{false, true} {
		req, _ := http.NewRequest("POST", srv.URL+"/o", strings.NewReader("a"))
		req.Header.Set("Idempotency-Key", "t-1")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || string(b) != "body" || (resp.Header.Get(httpx.ReplayedHeader) == "true") != want {
			t.Fatalf("response %d: %d %q replayed %q", i, resp.StatusCode, b, resp.Header.Get(httpx.ReplayedHeader))
		}
		if got := resp.Header.Get("X-Sum"); got != "" {
			t.Errorf("response %d: trailer X-Sum sent in the header too (%q)", i, got)
		}
		if got := resp.Trailer.Get("X-Sum"); got != "declared" {
			t.Errorf("response %d: trailer X-Sum %q, want %q (trailers %v)", i, got, "declared", resp.Trailer)
		}
		if got := resp.Trailer.Get("X-Late"); got != "undeclared" {
			t.Errorf("response %d: trailer X-Late %q, want %q (trailers %v)", i, got, "undeclared", resp.Trailer)
		}
	}
}

// TestLateTrailerOnFirstAndReplay: a trailer named with http.TrailerPrefix
// and set after a small body reaches the client on the first response and
// on the replay alike. Without the Guard, net/http drops it on HTTP/1.1 (it
// gives the small body a Content-Length, which leaves no room for
// trailers); the replay, which sets the stored trailer before its status,
// went out chunked and carried it, so a retry saw a trailer the first
// response never had. The Guard now announces such a trailer with the
// status, so both responses carry it (as HTTP/2 and a larger body do).
func TestLateTrailerOnFirstAndReplay(t *testing.T) {
	e := newEnv(t, guard.Options{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "body")
		w.Header().Set(http.TrailerPrefix+"X-Sum", "1")
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{}))
	first := fetch(t, c, srv.URL+"/o", "lt-1")
	replay := fetch(t, c, srv.URL+"/o", "lt-1")
	if first.body != "body" || first.trailer.Get("X-Sum") != "1" {
		t.Errorf("first response: %+v, want body %q and trailer X-Sum: 1", first, "body")
	}
	if !reflect.DeepEqual(first, replay) {
		t.Errorf("replay differs from the first response:\n got %+v\nwant %+v", replay, first)
	}
}
