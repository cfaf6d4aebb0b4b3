package watermillx

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestMessageHeldByDeadConsumerOutlivesItsLease, with Watermill's Timeout
// middleware around the dedup middleware (a per-handler time limit, which
// the middleware reads as the handler's timeout, not the consumer
// stopping). Waiting for another holder is not running the handler: the
// message must still be held until the dead holder's lease ends, not
// nacked at every Timeout, which spends the broker's delivery limit and
// drops the message, its effect never run.
func TestHeldMessageOutlivesTimeoutMiddleware(t *testing.T) {
	const limit, delay, lease, timeout = 5, 100 * time.Millisecond, 2 * time.Second, 200 * time.Millisecond
	g, _, _ := consumertest.Guard(t, guard.Options{})
	dead := guard.New(g.Store(), guard.Options{Lease: lease})
	b := newBus(t)
	q := newQueue(4)
	q.limit = limit
	var (
		effects atomic.Int32
		outs    consumertest.Outcomes
	)
	mw, err := New(g, Options{Group: "billing", InProgressDelay: delay,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	h := b.router.AddConsumerHandler("billing", "orders", q, func(*message.Message) error { effects.Add(1); return nil })
	h.AddMiddleware(middleware.Timeout(timeout), mw.Middleware) // Timeout outside
	t.Cleanup(func() { _ = q.Close() })
	ctx := context.Background()
	p, err := mw.processor("billing")
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte("charge 1")
	key, err := p.Key(consumerx.Message{ID: "order-1"})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload)
	if c, err := dead.Claim(ctx, key, base64.RawURLEncoding.EncodeToString(sum[:])); err != nil || c.Status != guard.Acquired {
		t.Fatalf("the dead consumer's claim: %+v, %v", c, err)
	}
	b.start()
	_ = q.Publish("orders", message.NewMessage("order-1", payload))
	deadline := time.Now().Add(3 * lease)
	for outs.Final()[consumerx.Processed] == 0 && q.dropped.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling an outcome
	}
	if effects.Load() != 1 || outs.Final()[consumerx.Processed] != 1 || q.dropped.Load() != 0 {
		t.Fatalf("%d effects, deliveries %v, %d dropped by the broker's limit of %d, with a %s Timeout middleware "+
			"and a dead holder's %s lease; want the message held, taken over and run once",
			effects.Load(), outs.All(), q.dropped.Load(), limit, timeout, lease)
	}
}
