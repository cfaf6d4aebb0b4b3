package httpx_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestTransportInFlightStatus429: behind a Guard whose InFlightStatus is
// 429, a duplicate sent while the key's first request runs is asked about
// again, as after the default 409, without using up MaxAttempts, and gets
// the first request's response. Before, the client knew an in-flight
// answer only as a 409 with Retry-After: each 429 counted as an attempt,
// it waited the whole Retry-After (1 s), and with MaxAttempts 2 the
// duplicate got the 429 while the first request still ran.
func TestTransportInFlightStatus429(t *testing.T) {
	e := newEnv(t, guard.Options{})
	started, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(open)
	var runs, answers429 atomic.Int64
	h := guarded(e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}), httpx.Options{InFlightStatus: http.StatusTooManyRequests})
	srv, plain := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		h.ServeHTTP(rec, r)
		// The duplicate's third in-flight answer is past MaxAttempts (2):
		// let the first request finish.
		if rec.status == http.StatusTooManyRequests && answers429.Add(1) == 3 {
			open()
		}
	}))

	first := make(chan reply, 1)
	go func() {
		r, err := send(t.Context(), plain, "POST", srv.URL+"/charges", "x", key("k-429")...)
		if err != nil {
			t.Errorf("first request: %v", err)
		}
		first <- r
	}()
	<-started

	c := retryClient(t, httpx.TransportOptions{MaxAttempts: 2, InFlightDelay: 20 * time.Millisecond})
	req, _ := http.NewRequest("POST", srv.URL+"/charges", strings.NewReader("x"))
	req.Header.Set("Idempotency-Key", "k-429")
	start := time.Now()
	resp, err := c.Do(req)
	open() // whatever the duplicate got, the first request may end
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if f := <-first; f.status != http.StatusCreated || string(f.body) != "charged" {
		t.Fatalf("first request: %d %q", f.status, f.body)
	}
	if resp.StatusCode != http.StatusCreated || string(b) != "charged" || resp.Header.Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("duplicate: %d %q replayed %q after %d in-flight answers and %s; want the replay of 201 \"charged\"",
			resp.StatusCode, b, resp.Header.Get(httpx.ReplayedHeader), answers429.Load(), took)
	}
	if n := answers429.Load(); n < 3 {
		t.Fatalf("%d in-flight answers, want at least 3 (more than MaxAttempts)", n)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	if took > 1500*time.Millisecond {
		t.Errorf("duplicate answered after %s; want within a few InFlightDelays (20 ms), not Retry-After (1 s) per answer (at least 2 s for 3 answers)", took)
	}
}

// TestTransportInFlightProblem: a response is taken for an in-flight
// answer, whatever its status, only by its Retry-After and its problem
// type (ProblemInFlight). Other 429s (a rate limiter's, a problem of
// another type) use up attempts as before, and an in-flight answer
// returned once MaxInFlightWait passed reaches the caller whole.
func TestTransportInFlightProblem(t *testing.T) {
	inFlight, _ := json.Marshal(httpx.Problem{Type: httpx.ProblemInFlight, Title: "Request with this key in progress",
		Status: http.StatusTooManyRequests, Key: "k"})
	limited, _ := json.Marshal(httpx.Problem{Type: "https://example.com/problems/rate-limited", Title: "Slow down",
		Status: http.StatusTooManyRequests})
	cases := []struct {
		name        string
		contentType string
		body        []byte
		inFlight    bool
	}{
		{"in flight", httpx.ProblemContentType, inFlight, true},
		{"in flight, media type with parameters", httpx.ProblemContentType + "; charset=utf-8", inFlight, true},
		{"rate limited problem", httpx.ProblemContentType, limited, false},
		{"plain rate limit", "text/plain", []byte("too many requests"), false},
		{"in-flight type as text", "text/plain", inFlight, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var attempts atomic.Int64
			srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				attempts.Add(1)
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", tc.contentType)
				w.Header().Set("Retry-After", "1")
				w.WriteHeader(http.StatusTooManyRequests)
				_, _ = w.Write(tc.body)
			}))
			opts := httpx.TransportOptions{MaxAttempts: 2, InFlightDelay: 20 * time.Millisecond, MaxInFlightWait: 150 * time.Millisecond}
			if !tc.inFlight {
				opts.MaxAttempts = 1 // one 429, returned: not asked again
			}
			resp, err := retryClient(t, opts).Post(srv.URL, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusTooManyRequests || string(b) != string(tc.body) {
				t.Fatalf("%d %q, want the 429 whole (%q)", resp.StatusCode, b, tc.body)
			}
			n := attempts.Load()
			if tc.inFlight && n < 3 {
				t.Fatalf("%d attempts; an in-flight answer is asked again until MaxInFlightWait, past MaxAttempts (2)", n)
			}
			if !tc.inFlight && n != 1 {
				t.Fatalf("%d attempts with MaxAttempts 1; a 429 that is not in flight uses up attempts", n)
			}
		})
	}
}
