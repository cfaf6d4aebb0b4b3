package jetstreamx

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The consumer's MaxDeliver is lowered on the server (10 → 3, an edit
// of the durable) after Consume was given its handle, whose cached info
// still says 10. A handler that fails every time (consumerx would allow
// it 5 attempts) reaches the server's last delivery, the third: Nak'ed
// there, the server drops it, nothing dead-lettered. Consume asks the
// server for the MaxDeliver in force before it Naks a message, and
// dead-letters it (ErrMaxDeliver) instead.
func TestMaxDeliverLoweredOnServerDeadLetters(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	m := newMaxDeliverTest(t)
	ctx := context.Background()
	stream, err := m.js.Stream(ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	cfg := m.cons.CachedInfo().Config
	cfg.MaxDeliver = 10
	stale, err := stream.CreateOrUpdateConsumer(ctx, cfg) // its cached info: MaxDeliver 10
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxDeliver = testMaxDeliver
	if _, err := stream.CreateOrUpdateConsumer(ctx, cfg); err != nil { // the server's: 3
		t.Fatal(err)
	}
	errDeclined := errors.New("card declined")
	var runs atomic.Int32
	h, err := New(g, func(context.Context, consumerx.Message) error { runs.Add(1); return errDeclined },
		Options{Group: "billing", MaxWait: 50 * time.Millisecond,
			Process: consumerx.Options{MaxAttempts: 5, DeadLetter: m.deadLetter, Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	m.cons = stale
	m.consume(t, h)
	if _, err := m.js.Publish(ctx, "orders.1", []byte("charge 1"), jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
	m.waitDeadLetteredOrDropped(t)
	dl := m.deadLetters()
	if len(dl) != 1 || m.drops.Load() != 0 {
		t.Fatalf("MaxDeliver lowered to %d on the server: %d runs, %d dead letters %v, %d dropped by the server; "+
			"want it dead-lettered on its last delivery, not dropped", testMaxDeliver, runs.Load(), len(dl), dl, m.drops.Load())
	}
	if !errors.Is(dl[0], ErrMaxDeliver) || !errors.Is(dl[0], errDeclined) {
		t.Fatalf("dead-letter cause %v: want one matching ErrMaxDeliver and the handler's error", dl[0])
	}
}
