package httpx_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestMaxBytesHandlerOutsideGuard: http.MaxBytesHandler (or a
// MaxBytesReader a middleware or Gin handler puts on the body) before the
// Guard, with a limit below MaxBody: a chunked body past it is stopped as
// the Guard reads it, and answered 413 with that limit in the problem's
// detail, not MaxBody's; nothing is stored, so the same key with a body
// within the limit runs.
func TestMaxBytesHandlerOutsideGuard(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(b)
	})
	srv, c := serve(t, http.MaxBytesHandler(httpx.Guard(e.g, httpx.Options{SingleCaller: true})(h), 1024))
	send := func(body string) reply {
		t.Helper()
		// A reader of unknown length: the body goes out chunked.
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/pay", io.MultiReader(strings.NewReader(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(httpx.DefaultHeader, "mb-1")
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return reply{status: res.StatusCode, header: res.Header, body: b}
	}
	r := send(strings.Repeat("x", 2048))
	if r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("past the limit: %d %q", r.status, r.body)
	}
	if p := r.problem(t); p.Type != httpx.ProblemBodyTooLarge || !strings.Contains(p.Detail, " 1024 ") {
		t.Fatalf("problem %+v; want body-too-large naming the limit, 1024", p)
	}
	if r := send("small"); r.status != http.StatusCreated || string(r.body) != "small" || runs.Load() != 1 {
		t.Fatalf("the same key within the limit: %d %q, runs %d", r.status, r.body, runs.Load())
	}
}
