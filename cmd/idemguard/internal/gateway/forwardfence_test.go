package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestZombieForwardStepNotTakenForItsSuccessors: a holder whose lease had
// run out (paused, cut off from Redis) that records "its" forward step in
// the millisecond its successor recorded one must not take the
// successor's step for its own and send the request a second time. The
// store refuses a former holder whatever step it sends (guard.StepStore),
// and each attempt's forward step names its claim's fence besides.
func TestZombieForwardStepNotTakenForItsSuccessors(t *testing.T) {
	u := newUpstream(t)
	e := startGateway(t, basicConfig, u.URL)
	key := guard.Key{Scope: `"acme" POST /orders`, ID: "k-zombie"}
	body := `{"order":"zombie"}`
	g := guard.New(e.store, guard.Options{Lease: time.Second})
	claim := func() guard.Lease {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		out, err := g.Claim(context.Background(), key, httpx.DefaultFingerprint(req, []byte(body)))
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim: %+v, %v", out, err)
		}
		return out.Lease
	}
	old := claim()
	testenv.WaitFor(t, 10*time.Second, "the first lease to run out on the server's clock", func() bool {
		rec, err := e.store.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		return rec.LeaseLeft == 0
	})
	now := time.Now() // both record their step in this millisecond
	successor := &attempt{lease: claim(), ctx: context.Background()}
	if ran, _, err := successor.recordForward(now); !ran || err != nil {
		t.Fatalf("the successor's forward step: ran=%v, %v", ran, err)
	}
	zombie := &attempt{lease: old, ctx: context.Background()}
	if ran, _, err := zombie.recordForward(now); ran || err == nil {
		t.Fatalf("the old holder's forward step, in the same millisecond: ran=%v, %v; want it refused (the lease is lost), not sent again", ran, err)
	}
}
