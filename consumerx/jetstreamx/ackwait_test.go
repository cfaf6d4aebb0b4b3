package jetstreamx

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The durable's AckWait lowered while Consume runs a long handler: the
// message is reported in progress at the new AckWait's pace from the next
// read of the consumer's info (every ackRefresh), so a second puller of
// the durable gets nothing while the handler runs. (Consume read AckWait
// once at its start: reported every 3 s against a new AckWait of 2 s, the
// message was redelivered to the other puller while its handler ran.)
func TestConsumeAckWaitLoweredWhileRunning(t *testing.T) {
	const oldWait, newWait = 9 * time.Second, 2 * time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	cfg := jetstream.ConsumerConfig{AckWait: oldWait}
	cons := ordersConsumer(t, js, cfg)
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	started := make(chan struct{})
	var outs consumertest.Outcomes
	h, err := New(g, func(context.Context, consumerx.Message) error {
		if runs.Add(1) == 1 {
			close(started)
		}
		time.Sleep(5 * time.Second / 2) // the effect outlives the new AckWait
		return nil
	}, Options{Group: "billing", MaxWait: 100 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	stop := consumeAll(t, h, cons, 1)
	defer stop()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the message did not run")
	}
	// The operator lowers AckWait while the handler runs.
	cfg.Durable, cfg.AckPolicy, cfg.AckWait = "billing", jetstream.AckExplicitPolicy, newWait
	if _, err := js.UpdateConsumer(ctx, "ORDERS", cfg); err != nil {
		t.Fatal(err)
	}
	// Another consumer of the durable while the handler runs.
	again, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range again.Messages() {
		md, _ := m.Metadata()
		t.Errorf("redelivered while its handler ran (delivery %d)", md.NumDelivered)
	}
	testenv.WaitFor(t, 10*time.Second, "the message processed", func() bool { return outs.Final()[consumerx.Processed] == 1 })
	if runs.Load() != 1 {
		t.Errorf("%d runs, want 1", runs.Load())
	}
}

// A BackOff value of 1 ms does not make Consume report a running message
// in progress every 333 µs: the reports come at most every
// MinInProgressEvery. (A 500 ms handler sent 489 reports.)
func TestInProgressCadenceFloor(t *testing.T) {
	const run = 500 * time.Millisecond
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	// The first delivery waits 5 s for its ack; the shortest value is 1 ms.
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{BackOff: []time.Duration{5 * time.Second, time.Millisecond}, MaxDeliver: 10})
	var (
		mu          sync.Mutex
		reports     int
		first, last time.Time // when the first and the last report came
	)
	sub, err := js.Conn().Subscribe("$JS.ACK.ORDERS.billing.>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			mu.Lock()
			defer mu.Unlock()
			if reports++; reports == 1 {
				first = time.Now()
			}
			last = time.Now()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	var outs consumertest.Outcomes
	h, err := New(g, func(context.Context, consumerx.Message) error {
		time.Sleep(run) // the effect's length
		return nil
	}, Options{Group: "billing", MaxWait: 100 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	stop := consumeAll(t, h, cons, 1)
	testenv.WaitFor(t, 10*time.Second, "the message processed", func() bool { return outs.Final()[consumerx.Processed] == 1 })
	stop()
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// One per MinInProgressEvery at most, over the time they came in
	// (a tenth off, and one more, for the lateness of their delivery to
	// this client).
	over := last.Sub(first)
	max := int(over/(MinInProgressEvery*9/10)) + 2
	t.Logf("%d in-progress reports over %s, during a %s handler", reports, over.Round(time.Millisecond), run)
	if reports == 0 || reports > max {
		t.Errorf("%d in-progress reports over %s; want 1 to %d (one per %s)", reports, over.Round(time.Millisecond), max, MinInProgressEvery)
	}
}
