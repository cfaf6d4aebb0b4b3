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

// fetchCounter is the real consumer, its pull requests counted.
type fetchCounter struct {
	jetstream.Consumer
	n atomic.Int64
}

func (c *fetchCounter) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	c.n.Add(1)
	return c.Consumer.Fetch(n, opts...)
}

func (c *fetchCounter) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	c.n.Add(1)
	return c.Consumer.FetchNoWait(n)
}

// A pull the server answers with an error (nats.go hands it over in the
// batch, not from Fetch): when the durable or its stream is deleted under
// Consume, Consume returns an error saying so instead of pulling again
// for ever; when the error may pass (here the consumer's MaxWaiting pull
// requests taken by another puller), Consume pulls again after a pause,
// not thousands of times a second. The message published meanwhile is
// run once the way is clear.
func TestConsumeFetchErrors(t *testing.T) {
	// Deleted while a pull waits (the server tells it), or while the
	// batch runs (the next pull finds no responders: the consumer's info
	// says it is gone).
	for _, c := range []struct{ gone, when string }{{"consumer", "pull"}, {"stream", "pull"}, {"consumer", "batch"}, {"stream", "batch"}} {
		gone := c.gone
		t.Run(gone+" deleted during a "+c.when, func(t *testing.T) {
			g, _, _ := consumertest.Guard(t, guard.Options{})
			js, _ := startNATS(t)
			ctx := context.Background()
			cons := ordersConsumer(t, js, jetstream.ConsumerConfig{})
			var runs atomic.Int32
			deleted := make(chan struct{})
			h, err := New(g, func(context.Context, consumerx.Message) error {
				runs.Add(1)
				if c.when == "batch" {
					<-deleted
				}
				return nil
			}, Options{Group: "billing", MaxWait: 200 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t)}})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- h.Consume(ctx, cons) }()
			if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 10*time.Second, "the message run", func() bool { return runs.Load() == 1 })
			if gone == "consumer" {
				err = js.DeleteConsumer(ctx, "ORDERS", "billing")
			} else {
				err = js.DeleteStream(ctx, "ORDERS")
			}
			if err != nil {
				t.Fatal(err)
			}
			close(deleted)
			select {
			case err := <-done:
				t.Logf("Consume returned %v", err)
				if !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrConsumerDeleted) &&
					!errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Errorf("Consume returned %v, want an error saying the %s is gone", err, gone)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("Consume still pulls 5s after its %s was deleted", gone)
			}
		})
	}
	t.Run("pulls refused for a while", func(t *testing.T) {
		g, _, _ := consumertest.Guard(t, guard.Options{})
		js, _ := startNATS(t)
		ctx := context.Background()
		cons := ordersConsumer(t, js, jetstream.ConsumerConfig{MaxWaiting: 1})
		other, err := js.Consumer(ctx, "ORDERS", "billing")
		if err != nil {
			t.Fatal(err)
		}
		// Another puller takes the one waiting pull request the consumer allows.
		hold, err := other.Fetch(1, jetstream.FetchMaxWait(1500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		h, err := New(g, func(context.Context, consumerx.Message) error { runs.Add(1); return nil },
			Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t)}})
		if err != nil {
			t.Fatal(err)
		}
		counted := &fetchCounter{Consumer: cons}
		stop := consumeAll(t, h, counted, 1)
		for range hold.Messages() { // the other's pull ends, empty, after its MaxWait
		}
		pulls := counted.n.Load()
		if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the message run", func() bool { return runs.Load() == 1 })
		stop()
		t.Logf("%d pull requests while refused", pulls)
		// A pause after each refused pull, from MaxWait/10 (100ms) and
		// twice as long each time: a few in 1.5s.
		if pulls > 50 {
			t.Errorf("%d pull requests while the other puller held the consumer's one waiting request for 1.5s, want a few", pulls)
		}
	})
}
