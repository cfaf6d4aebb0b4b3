package ginx_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemguard/idemguard/ginx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// informational is one 1xx response a client received.
type informational struct {
	code int
	link string
}

// postSeeing1xx posts to url with key and returns the informational
// responses the client saw before the final one, and the final one.
func postSeeing1xx(t *testing.T, url, key string) ([]informational, int, string, http.Header) {
	t.Helper()
	var got []informational
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		got = append(got, informational{code, h.Get("Link")})
		return nil
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost, url, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(httpx.DefaultHeader, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return got, resp.StatusCode, string(body), resp.Header
}

// TestEarlyHintsReachClient: a Gin handler that sends 103 Early Hints on
// net/http's writer (Gin's own holds a status until the body) and then
// its answer. Unguarded, the client sees the 103 and then the 201; behind
// Guard it must too, as behind httpx.Guard (the core sends 1xx at once and
// does not store them): the 103 used to reach only Gin's writer, which
// recorded its status and dropped it. A replay is the stored 201, without
// the hint.
func TestEarlyHintsReachClient(t *testing.T) {
	var runs atomic.Int64
	hinted := func(c *gin.Context) {
		runs.Add(1)
		c.Header("Link", "</a.css>; rel=preload")
		c.Writer.(interface{ Unwrap() http.ResponseWriter }).Unwrap().WriteHeader(http.StatusEarlyHints)
		c.Header("Link", "")
		c.String(http.StatusCreated, "done")
	}
	g := guardenv.Guard(t, guard.Options{})
	r := gin.New()
	r.POST("/plain", hinted)
	r.POST("/guarded", ginx.Guard(g, ginx.Options{Options: httpx.Options{SingleCaller: true}}), hinted)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)

	want := []informational{{http.StatusEarlyHints, "</a.css>; rel=preload"}}
	same := func(a, b []informational) bool {
		if len(a) != len(b) {
			return false
		}
		for i := range a {
			if a[i] != b[i] {
				return false
			}
		}
		return true
	}
	if hints, code, body, _ := postSeeing1xx(t, srv.URL+"/plain", "k"); !same(hints, want) || code != http.StatusCreated || body != "done" {
		t.Fatalf("unguarded: hints %v, %d %q; want %v, 201 \"done\"", hints, code, body, want)
	}
	hints, code, body, _ := postSeeing1xx(t, srv.URL+"/guarded", "k")
	if code != http.StatusCreated || body != "done" {
		t.Fatalf("guarded: %d %q, want 201 \"done\"", code, body)
	}
	if !same(hints, want) {
		t.Errorf("guarded: the client saw informational responses %v, want %v (as unguarded, and as behind httpx.Guard)", hints, want)
	}
	hints, code, body, h := postSeeing1xx(t, srv.URL+"/guarded", "k")
	if code != http.StatusCreated || body != "done" || h.Get(httpx.ReplayedHeader) != "true" || len(hints) != 0 {
		t.Errorf("replay: hints %v, %d %q %v; want the stored 201 \"done\", replayed, no hint", hints, code, body, h)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (once unguarded, once guarded)", n)
	}

	// The same handler on net/http behind httpx.Guard: the hint goes out.
	mux := http.NewServeMux()
	mux.Handle("POST /orders", httpx.Guard(g, httpx.Options{SingleCaller: true})(http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "done")
		})))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	if hints, code, body, _ := postSeeing1xx(t, hs.URL+"/orders", "k"); !same(hints, want) || code != http.StatusCreated || body != "done" {
		t.Errorf("httpx: hints %v, %d %q; want %v, 201 \"done\"", hints, code, body, want)
	}
}
