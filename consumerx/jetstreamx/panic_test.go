package jetstreamx

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A handler that panics through Handle (which, like Process, lets the
// panic go on) stops reporting its message in progress: the caller that
// recovers the panic sees the message redelivered once AckWait has run
// out, rather than kept in progress, and never delivered again, by a
// reporter left running.
func TestHandlePanicStopsInProgressReports(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	const ackWait = 300 * time.Millisecond
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(g, func(context.Context, consumerx.Message) error { panic("nil map") },
		Options{Group: "billing", InProgressEvery: ackWait / 6, Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		func() {
			defer func() {
				if p := recover(); p != "nil map" {
					t.Errorf("recovered %v, want the handler's panic", p)
				}
			}()
			h.Handle(ctx, msg)
		}()
	}
	// With the reporter left running, AckWait never runs out.
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(20*ackWait))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for msg := range again.Messages() {
		n++
		_ = msg.Ack()
	}
	if n != 1 {
		t.Errorf("redelivered %d messages within %s, want 1 (after AckWait %s)", n, 20*ackWait, ackWait)
	}
}
