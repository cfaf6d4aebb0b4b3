package httpx_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/httpx"
)

// TestStalledProblemBodyReturnsHeader: a response is returned once its
// header has come (the Transport's doc), even one whose problem body
// stalls before the Transport could read its type: a 429 with a
// Retry-After past MaxRetryAfter, so not retried, came back only when the
// context ended. The body returned is whole: the bytes read to learn the
// type come first, then the rest as the server sends it.
func TestStalledProblemBodyReturnsHeader(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", httpx.ProblemContentType)
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"type":`)
		http.NewResponseController(w).Flush()
		select {
		case <-release:
			_, _ = io.WriteString(w, `"https://example.com/problems/rate"}`)
		case <-r.Context().Done():
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("x"))
	start := time.Now()
	resp, err := retryClient(t, httpx.TransportOptions{}).Do(req)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("after %v: %v; want the 429 as soon as its header came", took.Round(time.Millisecond), err)
	}
	defer resp.Body.Close()
	if took > time.Second {
		t.Fatalf("header returned after %v; want it at once", took.Round(time.Millisecond))
	}
	unblock()
	b, err := io.ReadAll(resp.Body)
	if want := `{"type":"https://example.com/problems/rate"}`; err != nil || string(b) != want {
		t.Fatalf("body %q, %v; want %q", b, err, want)
	}
}
