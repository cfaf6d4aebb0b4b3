package gateway

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestStepRecordedButNothingSent: the gate records the forward step just
// before the first write, but that write can fail with nothing written (the
// connection was already shut for writing, reset, or closed). No byte of
// the request left the gateway, so the upstream never saw it: the key is
// released (503 not-forwarded), and the retry forwards it, rather than
// answering outcome-unknown for a request that was never sent. Any byte
// written keeps the request delivered (TestNoResendByNetHTTP,
// TestFailureAfterDeliveryIsStoredUnknown).
func TestStepRecordedButNothingSent(t *testing.T) {
	u := newUpstream(t)
	var broken atomic.Bool
	broken.Store(true)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil || !broken.Load() {
			return c, err
		}
		// A real connection, open at both ends, whose writes all fail
		// (their deadline has passed) with nothing written: the upstream
		// sees a connection and no request.
		if err := c.SetWriteDeadline(time.Unix(1, 0)); err != nil {
			t.Error(err)
		}
		return c, nil
	}
	e := startGateway(t, basicConfig+"    ttl: 1h\n", u.URL, func(o *Options) { o.dial = dial })
	r := post(t, e.srv.URL+"/orders", "k-unsent", `{"order":"unsent"}`, "X-Account-Id", "acme")
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded {
		t.Fatalf("a write that sent nothing: %d %q; want 503 not-forwarded", r.status, r.body)
	}
	if n := u.count("unsent"); n != 0 {
		t.Fatalf("the upstream got the request %d times, want 0", n)
	}
	key := guard.Key{Scope: `"acme" POST /orders`, ID: "k-unsent"}
	// Released: a record with steps cannot be undone, so it is failed,
	// holding the forward step and the mark that it sent nothing.
	rec, err := e.store.Get(context.Background(), key)
	if err != nil || rec.State != guard.StateFailed || len(rec.Steps) != 2 || rec.Steps[0].Name != forwardStep || rec.Steps[1].Name != unsentName(1) {
		t.Fatalf("the key's record: %+v, %v; want failed, with steps %q and %q", rec, err, forwardStep, unsentName(1))
	}
	// Twice: the chain of forwards that sent nothing grows.
	r = post(t, e.srv.URL+"/orders", "k-unsent", `{"order":"unsent"}`, "X-Account-Id", "acme")
	if r.status != http.StatusServiceUnavailable || r.problemType() != ProblemNotForwarded {
		t.Fatalf("a second write that sent nothing: %d %q; want 503 not-forwarded", r.status, r.body)
	}
	broken.Store(false)
	r = post(t, e.srv.URL+"/orders", "k-unsent", `{"order":"unsent"}`, "X-Account-Id", "acme")
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("the retry: %d %q; want the upstream's 201", r.status, r.body)
	}
	if n := u.count("unsent"); n != 1 {
		t.Fatalf("the upstream ran it %d times, want 1", n)
	}
}

// TestLaterForwardAfterUnsentIsUnknown: the mark that a forward sent
// nothing covers that forward only. A record holding a forward that sent
// nothing, then a later attempt's forward whose holder died, is a key that
// may have been delivered: outcome-unknown, and never sent again.
func TestLaterForwardAfterUnsentIsUnknown(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	key := guard.Key{Scope: `"acme" POST /orders`, ID: "k-chain"}
	body := `{"order":"chain"}`
	g := guard.New(e.store, guard.Options{Lease: time.Second})
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	out, err := g.Claim(context.Background(), key, httpx.DefaultFingerprint(req, []byte(body)))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim: %+v, %v", out, err)
	}
	for _, name := range []string{forwardName(1), unsentName(1), forwardName(2)} {
		if _, err := guard.Step(context.Background(), out.Lease, name, func(context.Context) (int64, error) {
			return time.Now().UnixMilli(), nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "the abandoned lease to run out on the server's clock", func() bool {
		rec, err := e.store.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return rec.LeaseLeft == 0
	})
	r := post(t, e.srv.URL+"/orders", "k-chain", body, "X-Account-Id", "acme")
	if r.status != http.StatusInternalServerError || r.problemType() != ProblemOutcomeUnknown || !strings.Contains(r.body, "earlier attempt") {
		t.Fatalf("a later forward, not marked unsent: %d %q; want 500 outcome-unknown", r.status, r.body)
	}
	if n := u.count("chain"); n != 0 {
		t.Fatalf("the upstream got it %d times, want 0", n)
	}
}
