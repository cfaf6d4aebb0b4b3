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
// processed once, then acknowledged. Reported every third of AckWait, the
// message is rightly redelivered when the machine holds the process back
// for two thirds of it (make test's load: seen with 300 ms); a
// redelivery after the server heard nothing of the message for over half
// of AckWait proves nothing, and the case runs again with an AckWait
// twice as long (testenv.OnTime). One while the reports came on time
// fails at once.
func TestHandleLongHandlerNotRedelivered(t *testing.T) {
	testenv.OnTime(t, "an AckWait", 300*time.Millisecond, 3, func(ackWait time.Duration) bool {
		return handleLongNotRedelivered(t, ackWait)
	})
}

// handleLongNotRedelivered runs the case with ackWait; late reports a
// redelivery that followed a silence of over half of it.
func handleLongNotRedelivered(t *testing.T, ackWait time.Duration) (late bool) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, stopNATS := startNATS(t)
	defer stopNATS()
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
	var heard ackTimeline
	sub, err := js.Conn().Subscribe(">", heard.add)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := js.Conn().Flush(); err != nil {
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
	var redelivered []uint64
	for m := range again.Messages() {
		md, _ := m.Metadata()
		redelivered = append(redelivered, md.NumDelivered)
	}
	r := <-done
	if len(redelivered) > 0 {
		silence, events := heard.longestSilence(1)
		if silence > ackWait/2 {
			t.Logf("redelivered (delivery %v) after the server heard nothing of delivery 1 for %s, reports due every %s: %v",
				redelivered, silence.Round(time.Millisecond), ackWait/3, events)
			return true
		}
		t.Errorf("redelivered while its handler ran (delivery %v), the longest silence %s: %v",
			redelivered, silence.Round(time.Millisecond), events)
	}
	if r.o != consumerx.Processed || r.err != nil || runs.Load() != 1 {
		t.Errorf("Handle: %s, %v, %d runs; want processed once", r.o, r.err, runs.Load())
	}
	return false
}
