package jetstreamx

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A message whose consumers are stopped mid-handler more times than
// MaxAttempts is still processed exactly once, and nothing is
// dead-lettered: each stop Naks it for the next consumer at once.
func TestShutdownIsNotFailure(t *testing.T) {
	const maxAttempts, stops = 2, 3
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	h := consumertest.NewInterrupted(stops)
	var outs consumertest.Outcomes
	var dead atomic.Int32
	handler, err := New(g, h.Handle, Options{Group: "billing", RetryDelay: time.Minute, Process: consumerx.Options{
		MaxAttempts: maxAttempts, Logger: testenv.Logger(t), OnOutcome: outs.Hook,
		DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	consume := func() (stop func()) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- handler.Consume(runCtx, cons) }()
		return func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Consume did not return")
			}
		}
	}
	for range stops {
		stop := consume()
		h.WaitStarted(t, 10*time.Second)
		stop() // the consumer shuts down mid-handler
	}
	stop := consume()
	testenv.WaitFor(t, 10*time.Second, "the message processed and acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && h.Effects.Load() == 1 && info.NumAckPending == 0 && info.NumPending == 0
	})
	stop()
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	all := outs.All()
	if h.Effects.Load() != 1 || dead.Load() != 0 || all[consumerx.Interrupted] != stops || all[consumerx.Processed] != 1 ||
		all[consumerx.DeadLettered] != 0 || all[consumerx.Failed] != 0 {
		t.Fatalf("effects %d, dead letters %d, outcomes %v; want 1 effect, %d interrupted, nothing dead",
			h.Effects.Load(), dead.Load(), all, stops)
	}
}
