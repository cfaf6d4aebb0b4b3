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

// A message whose handler always panics, consumed by Consume (whose
// batches count a panic as a failed attempt) from a consumer with a
// MaxDeliver above the attempts, is dead-lettered once the attempts run
// out, before the server's MaxDeliver would drop it undead-lettered.
func TestConsumePanickingMessageDeadLetteredBeforeMaxDeliver(t *testing.T) {
	const maxAttempts, maxDeliver = 2, 4
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: maxDeliver,
	})
	if err != nil {
		t.Fatal(err)
	}
	var runs, dead atomic.Int32
	var outs consumertest.Outcomes
	h, err := New(g, func(context.Context, consumerx.Message) error { runs.Add(1); panic("nil map") },
		Options{Group: "billing", MaxWait: 100 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t),
			MaxAttempts: maxAttempts, OnOutcome: outs.Hook,
			DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Consume(runCtx, cons) }()
	testenv.WaitFor(t, 10*time.Second, "the message dead-lettered, or its deliveries used up", func() bool {
		return dead.Load() == 1 || outs.All()[consumerx.Failed] >= maxDeliver
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if runs.Load() != maxAttempts || dead.Load() != 1 {
		t.Errorf("ran %d times, dead-lettered %d; want %d runs, 1 dead letter", runs.Load(), dead.Load(), maxAttempts)
	}
}
