package httpx_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/httpx"
)

// TestStalledProblemBodyDoesNotHoldRetry: a 503 with Retry-After: 0 whose
// body is a problem document (application/problem+json, the shape of a
// gateway's or the Guard's own 503) that stalls after its first bytes is
// retried as soon as the Transport has given up reading its problem type,
// and the retry's 201 is the answer. The read that tells an in-flight
// answer had no bound but the context: the call waited for the body to
// end, which it never did (without a deadline it never returned).
func TestStalledProblemBodyDoesNotHoldRetry(t *testing.T) {
	release := make(chan struct{})
	var attempts atomic.Int64
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if attempts.Add(1) > 1 {
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.Header().Set("Content-Type", httpx.ProblemContentType)
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"type":"https://example.com/problems/overloaded",`)
		http.NewResponseController(w).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("x"))
	start := time.Now()
	resp, err := retryClient(t, httpx.TransportOptions{}).Do(req)
	if err != nil {
		t.Fatalf("after %d attempts and %v: %v; want the retry's 201", attempts.Load(), time.Since(start).Round(time.Millisecond), err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("%d after %d attempts; want the retry's 201", resp.StatusCode, attempts.Load())
	}
}

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
