package watermillx

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// slowClaim is a store whose claims take a while (a loaded Redis, a
// failover's first answer).
type slowClaim struct {
	guard.Store
	d time.Duration
}

func (s slowClaim) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	time.Sleep(s.d)
	return s.Store.Claim(ctx, req)
}

// TestNoHoldKeepsTimeoutDeadline: 71d5d70 re-bases the deadline of
// Watermill's Timeout middleware to when the handler runs, so that a
// message held while in progress elsewhere gets its full timeout. A
// message that was never held must keep Watermill's deadline as it is:
// the handler's context must not end later than the Timeout middleware's.
// It does: the time the claim took is added to the handler's timeout
// (here a 300ms claim under a 500ms Timeout gives the handler 800ms).
func TestNoHoldKeepsTimeoutDeadline(t *testing.T) {
	const timeout, claim = 500 * time.Millisecond, 300 * time.Millisecond
	g0, _, _ := consumertest.Guard(t, guard.Options{})
	g := guard.New(slowClaim{Store: g0.Store(), d: claim}, guard.Options{})
	mw, err := New(g, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	var outer, inner time.Time
	h := func(msg *message.Message) ([]*message.Message, error) {
		inner, _ = msg.Context().Deadline()
		return nil, nil
	}
	record := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			outer, _ = msg.Context().Deadline() // the Timeout middleware's
			return next(msg)
		}
	}
	chain := middleware.Timeout(timeout)(record(mw.Middleware(h)))
	if _, err := chain(message.NewMessage(watermill.NewUUID(), []byte("order"))); err != nil {
		t.Fatal(err)
	}
	if outer.IsZero() || inner.IsZero() {
		t.Fatalf("deadlines: Timeout's %v, handler's %v", outer, inner)
	}
	if inner.After(outer) {
		t.Errorf("a message never held: the handler's deadline is %s past the Timeout middleware's (%s timeout, %s claim); want the same deadline",
			inner.Sub(outer), timeout, claim)
	}
}
