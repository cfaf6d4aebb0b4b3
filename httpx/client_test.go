package httpx_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// retryClient is a retrying client with short backoff, closed with the test.
func retryClient(t *testing.T, opts httpx.TransportOptions) *http.Client {
	t.Helper()
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	opts.Base = base
	if opts.BaseDelay == 0 {
		opts.BaseDelay = 5 * time.Millisecond
	}
	return httpx.NewClient(opts)
}

// resetConn cuts the connection under w with a TCP reset.
func resetConn(t *testing.T, w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// TestRetryingClientOneEffect: the first attempt runs the effect but its
// answer is lost to a connection reset; the second meets a 503 with
// Retry-After; the third gets the stored answer. One effect, one key.
func TestRetryingClientOneEffect(t *testing.T) {
	e := newEnv(t, guard.Options{})
	var effects, attempts atomic.Int64
	var mu sync.Mutex
	var keys, bodies []string
	guarded := httpx.Guard(e.g, httpx.Options{Logger: testenv.Logger(t), SingleCaller: true})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		effects.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order 1")
	}))
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := attempts.Add(1)
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		bodies = append(bodies, string(body))
		mu.Unlock()
		switch n {
		case 1: // the effect happens, then the connection dies before the answer
			guarded.ServeHTTP(httptest.NewRecorder(), r)
			resetConn(t, w)
		case 2: // a load balancer sheds the request
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			guarded.ServeHTTP(w, r)
		}
	}))
	c := retryClient(t, httpx.TransportOptions{})
	start := time.Now()
	resp, err := c.Post(srv.URL+"/orders", "text/plain", strings.NewReader("buy"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	elapsed := time.Since(start)

	if resp.StatusCode != http.StatusCreated || string(body) != "order 1" || resp.Header.Get(httpx.ReplayedHeader) != "true" {
		t.Fatalf("final: %d %q replayed %q", resp.StatusCode, body, resp.Header.Get(httpx.ReplayedHeader))
	}
	if effects.Load() != 1 || attempts.Load() != 3 {
		t.Fatalf("effects %d attempts %d, want 1 and 3", effects.Load(), attempts.Load())
	}
	if n := e.records(t); n != 1 {
		t.Fatalf("%d keys stored, want 1", n)
	}
	for i := range keys {
		if keys[i] != keys[0] || bodies[i] != "buy" {
			t.Fatalf("attempt %d: key %q body %q; first key %q", i+1, keys[i], bodies[i], keys[0])
		}
	}
	u, err := uuid.Parse(keys[0])
	if err != nil || u.Version() != 7 {
		t.Fatalf("key %q is not a UUIDv7 (%v)", keys[0], err)
	}
	if got := resp.Request.Header.Get("Idempotency-Key"); got != keys[0] {
		t.Fatalf("resp.Request carries key %q, the server saw %q", got, keys[0])
	}
	if elapsed < time.Second {
		t.Fatalf("finished after %s: the 1 s Retry-After was not honoured", elapsed)
	}
}

// attemptServer answers every request with status (and Retry-After, if
// set) and counts the attempts and their keys.
type attemptServer struct {
	attempts atomic.Int64
	status   int
	after    string
	seen     chan string // each attempt's key, if not nil
}

func (s *attemptServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.attempts.Add(1)
	_, _ = io.Copy(io.Discard, r.Body)
	if s.seen != nil {
		s.seen <- r.Header.Get("Idempotency-Key")
	}
	if s.after != "" {
		w.Header().Set("Retry-After", s.after)
	}
	w.WriteHeader(s.status)
	io.WriteString(w, "busy")
}

func TestTransportKeys(t *testing.T) {
	s := &attemptServer{status: http.StatusOK, seen: make(chan string, 10)}
	srv, _ := serve(t, s)
	c := retryClient(t, httpx.TransportOptions{})

	for _, m := range []string{"POST", "PATCH"} {
		req, _ := http.NewRequest(m, srv.URL, strings.NewReader("x"))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		k := <-s.seen
		if u, err := uuid.Parse(k); err != nil || u.Version() != 7 {
			t.Fatalf("%s key %q: not a UUIDv7", m, k)
		}
		if req.Header.Get("Idempotency-Key") != "" {
			t.Fatal("the transport changed the caller's request")
		}
	}
	req, _ := http.NewRequest("POST", srv.URL, nil)
	req.Header.Set("Idempotency-Key", "mine")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if k := <-s.seen; k != "mine" {
		t.Fatalf("caller's key replaced by %q", k)
	}
	for _, m := range []string{"GET", "PUT", "DELETE"} {
		req, _ := http.NewRequest(m, srv.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if k := <-s.seen; k != "" {
			t.Fatalf("%s got a key %q", m, k)
		}
	}
}

func TestTransportRetryLimits(t *testing.T) {
	t.Run("statuses retried up to MaxAttempts", func(t *testing.T) {
		for _, code := range []int{409, 429, 502, 503, 504} {
			s := &attemptServer{status: code}
			srv, _ := serve(t, s)
			c := retryClient(t, httpx.TransportOptions{MaxAttempts: 3})
			resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != code || string(b) != "busy" || s.attempts.Load() != 3 {
				t.Fatalf("%d: final %d %q after %d attempts, want 3", code, resp.StatusCode, b, s.attempts.Load())
			}
		}
	})
	t.Run("other statuses not retried", func(t *testing.T) {
		for _, code := range []int{200, 400, 422, 500} {
			s := &attemptServer{status: code}
			srv, _ := serve(t, s)
			resp, err := retryClient(t, httpx.TransportOptions{}).Post(srv.URL, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if s.attempts.Load() != 1 {
				t.Fatalf("%d: %d attempts", code, s.attempts.Load())
			}
		}
	})
	t.Run("body without GetBody sent once", func(t *testing.T) {
		s := &attemptServer{status: 503}
		srv, _ := serve(t, s)
		req, _ := http.NewRequest("POST", srv.URL, io.NopCloser(strings.NewReader("x")))
		resp, err := retryClient(t, httpx.TransportOptions{}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if s.attempts.Load() != 1 {
			t.Fatalf("%d attempts, want 1", s.attempts.Load())
		}
	})
	t.Run("Retry-After past the deadline ends it", func(t *testing.T) {
		s := &attemptServer{status: 503, after: "2"}
		srv, _ := serve(t, s)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("x"))
		resp, err := retryClient(t, httpx.TransportOptions{}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || s.attempts.Load() != 1 {
			t.Fatalf("%d after %d attempts", resp.StatusCode, s.attempts.Load())
		}
	})
	t.Run("Retry-After over MaxRetryAfter ends it", func(t *testing.T) {
		// However many digits it has: past 2^32 seconds, or past what a
		// Duration holds, it is longer still, not unreadable (which would
		// be retried after the backoff).
		for _, after := range []string{"120", "4294967296", "99999999999999999999999"} {
			s := &attemptServer{status: 429, after: after}
			srv, _ := serve(t, s)
			resp, err := retryClient(t, httpx.TransportOptions{}).Post(srv.URL, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 429 || s.attempts.Load() != 1 {
				t.Fatalf("Retry-After %s: %d after %d attempts", after, resp.StatusCode, s.attempts.Load())
			}
		}
	})
	t.Run("cancel while waiting", func(t *testing.T) {
		s := &attemptServer{status: 503, after: "30", seen: make(chan string, 1)}
		srv, _ := serve(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-s.seen
			cancel()
		}()
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader("x"))
		_, err := retryClient(t, httpx.TransportOptions{}).Do(req)
		if !errors.Is(err, context.Canceled) || s.attempts.Load() != 1 {
			t.Fatalf("err %v after %d attempts", err, s.attempts.Load())
		}
	})
	t.Run("transport errors retried with the body", func(t *testing.T) {
		var attempts atomic.Int64
		var mu sync.Mutex
		var bodies []string
		srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			bodies = append(bodies, string(b))
			mu.Unlock()
			if attempts.Add(1) <= 2 {
				resetConn(t, w)
				return
			}
			io.WriteString(w, "ok")
		}))
		resp, err := retryClient(t, httpx.TransportOptions{}).Post(srv.URL, "text/plain", strings.NewReader("payload"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if attempts.Load() != 3 || strings.Join(bodies, ",") != "payload,payload,payload" {
			t.Fatalf("%d attempts, bodies %q", attempts.Load(), bodies)
		}
	})
}

// TestTransportInFlight: a 409 with Retry-After (the key's first request
// still runs) is asked about again within InFlightDelay, however long the
// Retry-After, without using up MaxAttempts, until MaxInFlightWait.
func TestTransportInFlight(t *testing.T) {
	var attempts atomic.Int64
	var mu sync.Mutex
	var gaps []time.Duration
	last := time.Time{}
	srv, _ := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := attempts.Add(1)
		mu.Lock()
		if !last.IsZero() {
			gaps = append(gaps, time.Since(last))
		}
		last = time.Now()
		mu.Unlock()
		if n <= 6 {
			w.Header().Set("Retry-After", "30") // what main answered: the lease left
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	c := retryClient(t, httpx.TransportOptions{MaxAttempts: 2, InFlightDelay: 100 * time.Millisecond})
	resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || attempts.Load() != 7 {
		t.Fatalf("%d after %d attempts; want 201 after 7 (six 409s do not use up MaxAttempts 2)", resp.StatusCode, attempts.Load())
	}
	for _, g := range gaps {
		if g < 80*time.Millisecond-10*time.Millisecond || g > 2*time.Second {
			t.Errorf("asked again after %s, want about InFlightDelay (100 ms), not Retry-After (30 s)", g)
		}
	}

	// MaxInFlightWait ends it.
	s := &attemptServer{status: http.StatusConflict, after: "1"}
	srv2, _ := serve(t, s)
	c = retryClient(t, httpx.TransportOptions{InFlightDelay: 50 * time.Millisecond, MaxInFlightWait: 300 * time.Millisecond})
	start := time.Now()
	resp, err = c.Post(srv2.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || time.Since(start) > 2*time.Second || s.attempts.Load() < 3 {
		t.Fatalf("%d after %d attempts and %s", resp.StatusCode, s.attempts.Load(), time.Since(start))
	}
}
