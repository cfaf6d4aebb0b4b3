package jetstreamx

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A handler that panics through Handle is a failed attempt of its
// message, as in Consume and HandleBatch, not a panic that goes on (nats.go
// does not recover one: a poison message would crash-loop the process):
// Handle returns Failed and Naks the message, whose redeliveries run it
// again until the attempts run out, and then dead-letter and acknowledge
// it. The in-progress reports stop with the run, so the Nak'ed message
// comes back.
func TestHandlePanicIsFailedAttempt(t *testing.T) {
	const maxAttempts = 2
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
	var (
		runs, dead atomic.Int32
		mu         sync.Mutex
		errs       []error
	)
	h, err := New(g, func(context.Context, consumerx.Message) error { runs.Add(1); panic("nil map") },
		Options{Group: "billing", InProgressEvery: ackWait / 6, Process: consumerx.Options{
			Logger: testenv.Logger(t), MaxAttempts: maxAttempts,
			DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil },
			OnOutcome: func(_ context.Context, _ consumerx.Message, _ consumerx.Outcome, err error) {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	var outs []consumerx.Outcome
	for len(outs) < 2*maxAttempts && (len(outs) == 0 || outs[len(outs)-1] != consumerx.DeadLettered) {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(20*ackWait))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("Handle let the handler's panic go on: %v", p)
					}
				}()
				o, err := h.Handle(ctx, msg)
				if err != nil {
					t.Errorf("acknowledge: %v", err)
				}
				outs = append(outs, o)
			}()
		}
		if n == 0 {
			t.Fatalf("no redelivery within %s after %v", 20*ackWait, outs)
		}
	}
	want := []consumerx.Outcome{consumerx.Failed, consumerx.DeadLettered}
	if !slices.Equal(outs, want) || runs.Load() != maxAttempts || dead.Load() != 1 {
		t.Errorf("outcomes %v, %d runs, %d dead letters; want %v, %d runs, 1 dead letter",
			outs, runs.Load(), dead.Load(), want, maxAttempts)
	}
	mu.Lock()
	var pe *guard.PanicError
	if len(errs) == 0 || !errors.Is(errs[0], guard.ErrPanicked) || !errors.As(errs[0], &pe) || pe.Value != "nil map" {
		t.Errorf("first outcome's error %v, want a *guard.PanicError with the handler's value", errs)
	}
	mu.Unlock()
	// Acknowledged: it does not come back.
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(3*ackWait))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range again.Messages() {
		t.Errorf("dead-lettered message delivered again: %s", msg.Data())
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
	stop := consumeAll(t, h, cons, 1)
	testenv.WaitFor(t, 10*time.Second, "the message dead-lettered, or its deliveries used up", func() bool {
		return dead.Load() == 1 || outs.All()[consumerx.Failed] >= maxDeliver
	})
	stop()
	if runs.Load() != maxAttempts || dead.Load() != 1 {
		t.Errorf("ran %d times, dead-lettered %d; want %d runs, 1 dead letter", runs.Load(), dead.Load(), maxAttempts)
	}
}
