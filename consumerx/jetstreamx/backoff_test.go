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

// A consumer whose BackOff's later values are below its first: the server
// sets AckWait to BackOff[0] and waits BackOff[n-1] for the ack of a
// message's n-th delivery. Consume must report the message in progress
// faster than the shortest of them, or a handler longer than that value
// is redelivered while it runs (to this process after the batch, or to
// another consumer of the durable at once). Here the message's second
// delivery runs three times the shortest BackOff, and a second puller of
// the durable gets nothing meanwhile.
func TestConsumeBackOffShorterThanAckWaitNotRedelivered(t *testing.T) {
	const shortest = 500 * time.Millisecond
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{BackOff: []time.Duration{10 * shortest, shortest}})
	if info := cons.CachedInfo(); info.Config.AckWait != 10*shortest {
		t.Fatalf("AckWait %s, want BackOff[0] %s", info.Config.AckWait, 10*shortest)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	// The first delivery, Nak'ed: the next waits BackOff[1] for its ack.
	first, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	msg := <-first.Messages()
	if msg == nil {
		t.Fatal("no message")
	}
	if err := msg.Nak(); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int32
	var delivery atomic.Uint64
	started := make(chan struct{})
	var outs consumertest.Outcomes
	h, err := New(g, func(_ context.Context, m consumerx.Message) error {
		if runs.Add(1) == 1 {
			md, _ := m.Raw.(jetstream.Msg).Metadata()
			delivery.Store(md.NumDelivered)
			close(started)
		}
		time.Sleep(3 * shortest) // the effect takes three of the shortest ack waits
		return nil
	}, Options{Group: "billing", MaxWait: 100 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Consume(runCtx, cons) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the redelivered message did not run")
	}
	// Another consumer of the durable while the handler runs.
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(3*shortest))
	if err != nil {
		t.Fatal(err)
	}
	for m := range again.Messages() {
		md, _ := m.Metadata()
		t.Errorf("redelivered while its handler ran (delivery %d; the handler's was %d)", md.NumDelivered, delivery.Load())
	}
	testenv.WaitFor(t, 10*time.Second, "the message processed and acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && outs.Final()[consumerx.Processed] == 1 && info.NumAckPending == 0 && info.NumPending == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	if runs.Load() != 1 || delivery.Load() != 2 {
		t.Fatalf("%d runs, the first on delivery %d; want one run, of the second delivery", runs.Load(), delivery.Load())
	}
}
