package watermillx

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// keepOpen is a subscriber a router's Close does not close, so that the
// next router can subscribe to the same Pub/Sub.
type keepOpen struct{ message.Subscriber }

func (keepOpen) Close() error { return nil }

// A message whose routers are closed mid-handler more times than
// MaxAttempts is still processed exactly once, and nothing is
// dead-lettered. The persistent gochannel hands its messages to every new
// subscriber, as a durable broker redelivers an unacknowledged message.
func TestShutdownIsNotFailure(t *testing.T) {
	const maxAttempts, stops = 2, 3
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	pubsub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	h := consumertest.NewInterrupted(stops)
	var outs consumertest.Outcomes
	var dead atomic.Int32
	mw, err := New(g, Options{Process: consumerx.Options{MaxAttempts: maxAttempts, Logger: testenv.Logger(t), OnOutcome: outs.Hook,
		DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pubsub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("charge 1"))); err != nil {
		t.Fatal(err)
	}
	consume := func() (stop func()) {
		r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
		if err != nil {
			t.Fatal(err)
		}
		r.AddMiddleware(mw.Middleware)
		r.AddConsumerHandler("billing", "orders", keepOpen{pubsub}, func(msg *message.Message) error {
			return h.Handle(msg.Context(), consumerx.Message{ID: msg.UUID, Payload: msg.Payload})
		})
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		select {
		case <-r.Running():
		case err := <-done:
			t.Fatalf("router run: %v", err)
		}
		return func() {
			if err := r.Close(); err != nil {
				t.Errorf("router close: %v", err)
			}
			if err := <-done; err != nil {
				t.Errorf("router run: %v", err)
			}
		}
	}
	for range stops {
		stop := consume()
		h.WaitStarted(t, 10*time.Second)
		stop() // the router closes mid-handler
	}
	stop := consume()
	testenv.WaitFor(t, 10*time.Second, "the message processed", func() bool {
		return outs.All()[consumerx.Processed] == 1
	})
	stop()
	if err := pubsub.Close(); err != nil {
		t.Error(err)
	}
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	all := outs.All()
	// A closing router may be handed the message again after its context
	// ended: one more interruption, without a run.
	if h.Effects.Load() != 1 || dead.Load() != 0 || all[consumerx.Interrupted] < stops || all[consumerx.Processed] != 1 ||
		all[consumerx.DeadLettered] != 0 || all[consumerx.Failed] != 0 {
		t.Fatalf("effects %d, dead letters %d, outcomes %v; want 1 effect, %d interrupted, nothing dead",
			h.Effects.Load(), dead.Load(), all, stops)
	}
}
