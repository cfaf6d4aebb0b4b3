package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestLateMarkSparesEarlierForward: a claim that recovers a key whose
// record holds an earlier attempt's forward step (that attempt's gateway
// died after sending; the upstream ran it) reaches the gate with its
// context already ended (the route's timeout, the gateway's hard stop or
// the lease's loss fell between the Transport's taking a connection and
// its first write). guard.Step then fails before any store call, and the
// attempt takes that failure for a forward step whose store call failed
// (markLateUnsent): it marks the EARLIER attempt's forward step unsent and
// releases the key as not forwarded, so the next claim forwards the
// request again. The upstream runs it twice.
func TestLateMarkSparesEarlierForward(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	ctx := context.Background()
	key := guard.Key{Scope: `"acme" POST /orders`, ID: "k-late-mark"}
	body := `{"order":"latemark"}`
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	fp := httpx.DefaultFingerprint(req, []byte(body))

	// The earlier attempt: claimed, recorded its forward step, sent the
	// request (the upstream ran it once), and died.
	g := guard.New(e.store, guard.Options{Lease: time.Second})
	out, err := g.Claim(ctx, key, fp)
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim: %+v, %v", out, err)
	}
	if _, err := guard.Step(ctx, out.Lease, forwardStep, func(context.Context) (forwardMark, error) {
		return forwardMark{At: time.Now().UnixMilli(), Fence: out.Lease.Fence}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := post(t, u.URL+"/orders", "", body); r.status != http.StatusCreated || u.count("latemark") != 1 {
		t.Fatalf("the earlier attempt's delivery: %d", r.status)
	}
	testenv.WaitFor(t, 10*time.Second, "the dead holder's lease to run out", func() bool {
		rec, err := e.store.Get(ctx, key)
		return err == nil && rec.LeaseLeft == 0
	})

	// The recovering claim, as httpx.Guard makes it for the gateway; its
	// context ends just before the Transport's first write.
	g2 := guard.New(e.store, guard.Options{Lease: 10 * time.Second})
	out2, err := g2.Claim(ctx, key, fp)
	if err != nil || out2.Status != guard.Acquired || len(out2.Steps) != 1 {
		t.Fatalf("recovering claim: %+v, %v", out2, err)
	}
	actx, cancel := context.WithCancelCause(ctx)
	cancel(errUpstreamTimeout)
	a := &attempt{lease: out2.Lease, ctx: actx}
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	werr := a.beforeWrite(&gateConn{Conn: c1})
	if werr == nil {
		t.Fatal("the gate let a write through with the attempt's context ended")
	}
	ex := &exchange{}
	r := req.WithContext(context.WithValue(context.WithValue(actx, attemptKey{}, a), exchangeKey{}, ex))
	rt := e.gw.routes[0]
	w := httptest.NewRecorder()
	rt.failed(w, r, werr)
	if ex.release != nil {
		// httpx.Guard releases the key when the handler asks it to.
		if err := e.store.Release(ctx, out2.Lease); err != nil {
			t.Fatal(err)
		}
	} else if err := e.store.Complete(ctx, out2.Lease, []byte("x"), time.Hour); err != nil {
		t.Fatal(err)
	}
	rec, _ := e.store.Get(ctx, key)
	for _, s := range rec.Steps {
		if s.Name == unsentName(1) {
			t.Errorf("the earlier attempt's forward step, which reached the upstream, was marked unsent by a later attempt that never asked the store for it (steps %v)", stepNames(rec.Steps))
		}
	}
	if errors.Is(werr, errEarlierForward) {
		return
	}
	// The client's retry.
	rr := post(t, e.srv.URL+"/orders", "k-late-mark", body, "X-Account-Id", "acme")
	if n := u.count("latemark"); n != 1 {
		t.Fatalf("the retry: %d %s; the upstream ran the request %d times, want 1", rr.status, rr.body, n)
	}
}

func stepNames(steps []guard.StepResult) []string {
	var n []string
	for _, s := range steps {
		n = append(n, s.Name)
	}
	return n
}
