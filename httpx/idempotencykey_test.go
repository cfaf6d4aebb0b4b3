package httpx_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
)

// TestTransportKeyFromContext: a key from WithIdempotencyKey is sent
// instead of a fresh one, for any method, and kept through retries; a key
// in the request's header wins; an empty one changes nothing; a key that
// is not a bare token is refused before anything is sent.
func TestTransportKeyFromContext(t *testing.T) {
	s := &attemptServer{status: http.StatusOK, seen: make(chan string, 10)}
	srv, _ := serve(t, s)
	c := retryClient(t, httpx.TransportOptions{})
	send := func(ctx context.Context, method string, header ...string) (string, error) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL, strings.NewReader("x"))
		if len(header) > 0 {
			req.Header.Set("Idempotency-Key", header[0])
		}
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		if req.Header.Get("Idempotency-Key") != strings.Join(header, "") {
			t.Fatal("the transport changed the caller's request")
		}
		return <-s.seen, nil
	}
	derived := guard.DownstreamKey(guard.Key{Scope: "shop", ID: "order-7"}, "charge")
	ctx := httpx.WithIdempotencyKey(context.Background(), derived)
	for _, m := range []string{"POST", "PATCH", "PUT", "GET", "DELETE"} {
		if k, err := send(ctx, m); err != nil || k != derived {
			t.Fatalf("%s with a key in its context sent key %q (%v), want %q", m, k, err, derived)
		}
	}
	if k, err := send(ctx, "POST", "mine"); err != nil || k != "mine" {
		t.Fatalf("the request's own key was replaced by %q (%v)", k, err)
	}
	empty := httpx.WithIdempotencyKey(ctx, "")
	if k, err := send(empty, "POST"); err != nil {
		t.Fatal(err)
	} else if u, err := uuid.Parse(k); err != nil || u.Version() != 7 {
		t.Fatalf("POST after an empty key: %q, want a fresh UUIDv7", k)
	}
	if k, err := send(empty, "GET"); err != nil || k != "" {
		t.Fatalf("GET after an empty key sent %q (%v), want none", k, err)
	}
	before := s.attempts.Load()
	for _, bad := range []string{"two words", strings.Repeat("k", httpx.MaxKeyLen+1), "a,b", `"quoted"`, "tab\there", "ключ"} {
		_, err := send(httpx.WithIdempotencyKey(context.Background(), bad), "POST")
		if !errors.Is(err, httpx.ErrMalformedKey) {
			t.Errorf("key %q: %v, want ErrMalformedKey", bad, err)
		}
	}
	if n := s.attempts.Load() - before; n != 0 {
		t.Fatalf("%d requests with malformed keys reached the server", n)
	}

	// Retries keep the context's key.
	busy := &attemptServer{status: http.StatusServiceUnavailable, after: "0", seen: make(chan string, 10)}
	bsrv, _ := serve(t, busy)
	c = retryClient(t, httpx.TransportOptions{MaxAttempts: 3})
	req, _ := http.NewRequestWithContext(ctx, "POST", bsrv.URL, strings.NewReader("x"))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for i := range 3 {
		if k := <-busy.seen; k != derived {
			t.Fatalf("attempt %d sent %q, want %q", i+1, k, derived)
		}
	}
}
