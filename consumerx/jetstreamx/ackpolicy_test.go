package jetstreamx

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A consumer that does not acknowledge each message on its own would lose
// a failed one: with AckAll the Ack of a later message of the batch
// acknowledges it too, with AckNone it was acknowledged when delivered;
// either way it never comes back, runs no more and is never
// dead-lettered. Consume refuses such a consumer before it fetches
// anything; on an AckExplicit one the message that failed runs again.
func TestConsumeRefusesConsumerWithoutExplicitAcks(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "b"} {
		if _, err := js.Publish(ctx, "orders.1", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, policy := range []jetstream.AckPolicy{jetstream.AckAllPolicy, jetstream.AckNonePolicy, jetstream.AckExplicitPolicy} {
		t.Run(policy.String(), func(t *testing.T) {
			cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing" + policy.String(), AckPolicy: policy})
			if err != nil {
				t.Fatal(err)
			}
			var failedA atomic.Bool
			var effects atomic.Int32
			h, err := New(g, func(_ context.Context, msg consumerx.Message) error {
				if string(msg.Payload) == "a" && !failedA.Swap(true) {
					return errors.New("flaky") // its first attempt fails
				}
				effects.Add(1)
				return nil
			}, Options{Group: "billing" + policy.String(), MaxWait: 100 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t)}})
			if err != nil {
				t.Fatal(err)
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- h.Consume(runCtx, cons) }()
			if policy != jetstream.AckExplicitPolicy {
				var err error
				select {
				case err = <-done:
				case <-time.After(5 * time.Second):
					stop()
					err = <-done
				}
				stop()
				if err == nil || !strings.Contains(err.Error(), "AckPolicy") || failedA.Load() || effects.Load() != 0 {
					t.Errorf("Consume of an %s consumer = %v (handler failed %v, %d effects), want refused before anything ran",
						policy, err, failedA.Load(), effects.Load())
				}
				return
			}
			testenv.WaitFor(t, 10*time.Second, "both messages run, the failed one again", func() bool { return effects.Load() == 2 })
			stop()
			if err := <-done; err != nil {
				t.Errorf("Consume: %v", err)
			}
		})
	}
}
