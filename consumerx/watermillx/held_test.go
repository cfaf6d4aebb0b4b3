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

// A consumer claimed a message and died: the broker hands the message
// (requeued when the dead consumer's connection closed) to another, which
// finds it in progress until the dead holder's lease runs out. Nacked
// every InProgressDelay meanwhile, it would spend a broker's delivery
// limit (a RabbitMQ quorum queue's delivery-limit, 20 by default) and be
// dropped, its effect never run. Held, without a nack, until it is no
// longer in progress, it is taken over when the lease ends and runs once.
// So too with Watermill's Timeout middleware around the guard's: its
// deadline is the handler's, and waiting for another holder is not
// running the handler (the hold waited on it, nacked the message at each
// timeout, and the broker's limit dropped it).
func TestMessageHeldByDeadConsumerOutlivesItsLease(t *testing.T) {
	for _, timeout := range []time.Duration{0, 200 * time.Millisecond} {
		name := "no timeout"
		if timeout > 0 {
			name = "timeout middleware outside"
		}
		t.Run(name, func(t *testing.T) { heldByDeadConsumer(t, timeout) })
	}
}

func heldByDeadConsumer(t *testing.T, timeout time.Duration) {
	const limit, delay, lease = 5, 100 * time.Millisecond, 2 * time.Second
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
	if timeout > 0 {
		h.AddMiddleware(middleware.Timeout(timeout)) // first added: outermost
	}
	h.AddMiddleware(mw.Middleware)
	t.Cleanup(func() { _ = q.Close() }) // after the router closed (cleanups run last first)
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
	sum := sha256.Sum256(payload) // the default fingerprint
	if c, err := dead.Claim(ctx, key, base64.RawURLEncoding.EncodeToString(sum[:])); err != nil || c.Status != guard.Acquired {
		t.Fatalf("the dead consumer's claim: %+v, %v", c, err)
	}
	b.start()
	_ = q.Publish("orders", message.NewMessage("order-1", payload))
	deadline := time.Now().Add(3 * lease)
	for outs.Final()[consumerx.Processed] == 0 && q.dropped.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling an outcome, not synchronising
	}
	if effects.Load() != 1 || outs.Final()[consumerx.Processed] != 1 || q.dropped.Load() != 0 {
		t.Fatalf("%d effects, deliveries %v, %d dropped by the broker's limit of %d, within %s of a dead holder's claim with a %s lease "+
			"(Timeout middleware %s); want the message taken over and run once", effects.Load(), outs.All(), q.dropped.Load(), limit, 3*lease, lease, timeout)
	}
}
