package jetstreamx

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Handle with Options.InProgressEvery keeps a handler that runs three
// times the consumer's AckWait from being redelivered while it runs: a
// second puller of the durable gets nothing meanwhile, and the message is
// processed once, then acknowledged.
func TestHandleLongHandlerNotRedelivered(t *testing.T) {
	const ackWait = 300 * time.Millisecond
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: ackWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	started := make(chan struct{})
	h, err := New(g, func(context.Context, consumerx.Message) error {
		runs.Add(1)
		close(started)
		time.Sleep(3 * ackWait) // the effect takes three AckWaits
		return nil
	}, Options{Group: "billing", InProgressEvery: ackWait / 3, Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg := <-batch.Messages()
	if msg == nil {
		t.Fatal("no message")
	}
	type handled struct {
		o   consumerx.Outcome
		err error
	}
	done := make(chan handled, 1)
	go func() {
		o, err := h.Handle(ctx, msg)
		done <- handled{o, err}
	}()
	<-started
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(3*ackWait))
	if err != nil {
		t.Fatal(err)
	}
	for m := range again.Messages() {
		md, _ := m.Metadata()
		t.Errorf("redelivered while its handler ran (delivery %d)", md.NumDelivered)
	}
	if r := <-done; r.o != consumerx.Processed || r.err != nil || runs.Load() != 1 {
		t.Errorf("Handle: %s, %v, %d runs; want processed once", r.o, r.err, runs.Load())
	}
}
