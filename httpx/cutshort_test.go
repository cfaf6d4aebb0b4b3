package httpx_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestResponseCutShortNotReplayedAsComplete: a handler that declares a
// Content-Length and writes less (a proxying handler whose upstream body
// broke off, http.ServeContent whose reader failed mid-copy) sends a
// response net/http cuts off: the client reads "unexpected EOF". The
// Guard stored the short body as the key's answer, so every retry got the
// same cut-off replay for the whole TTL. The handler ran (it returned its
// 200), so it is not run again: the key keeps a marker, and a retry gets
// the response-not-kept problem with the first status, readable whole.
// A HEAD, whose body is never sent, is stored as it is.
func TestResponseCutShortNotReplayedAsComplete(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "10")
		w.WriteHeader(http.StatusOK)
		if r.Method != http.MethodHead {
			_, _ = io.WriteString(w, "0123") // the upstream broke off
		}
	})
	srv, c := serve(t, guarded(e, h, httpx.Options{Methods: []string{"POST", "HEAD"}}))
	do := func(method, key string) (*http.Response, []byte, error) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+"/proxy", strings.NewReader(""))
		req.Header.Set("Idempotency-Key", key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	if _, _, err := do("POST", "cl-1"); err == nil {
		t.Fatal("the first response was read whole; want it cut off (net/http's unexpected EOF)")
	}
	resp, b, err := do("POST", "cl-1")
	var p struct{ Type string }
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get(httpx.ReplayedHeader) != "true" ||
		json.Unmarshal(b, &p) != nil || p.Type != httpx.ProblemResponseNotKept {
		t.Errorf("retry: %d replayed=%q body %q, read error %v; want 200, replayed, the response-not-kept problem whole",
			resp.StatusCode, resp.Header.Get(httpx.ReplayedHeader), b, err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the handler ran %d times, want once", n)
	}
	if _, _, err := do("HEAD", "cl-head"); err != nil {
		t.Fatal(err)
	}
	resp, _, err = do("HEAD", "cl-head")
	if err != nil || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Length") != "10" || resp.Header.Get(httpx.ReplayedHeader) != "true" {
		t.Errorf("HEAD's retry: %d, Content-Length %q, replayed %q, %v; want its 200 replayed as it was", resp.StatusCode,
			resp.Header.Get("Content-Length"), resp.Header.Get(httpx.ReplayedHeader), err)
	}
}
