package jetstreamx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startNATS runs an embedded nats-server with JetStream on a random port,
// and a client of it. The returned stop closes both and waits for the
// server to be down.
func startNATS(t testing.TB) (js jetstream.JetStream, stop func()) {
	t.Helper()
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		ns.Shutdown()
		t.Fatal(err)
	}
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			nc.Close()
			ns.Shutdown()
			ns.WaitForShutdown()
		})
	}
	t.Cleanup(stop)
	return js, stop
}

// ordersConsumer makes the stream ORDERS (subjects orders.>) and, on it,
// the durable consumer "billing" with explicit acks and cfg's other
// settings.
func ordersConsumer(t testing.TB, js jetstream.JetStream, cfg jetstream.ConsumerConfig) jetstream.Consumer {
	t.Helper()
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Durable, cfg.AckPolicy = "billing", jetstream.AckExplicitPolicy
	cons, err := stream.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cons
}

// lostAck is a message whose Ack never reaches the server, as when the
// consumer dies right after acknowledging; it counts the acks lost.
type lostAck struct {
	jetstream.Msg
	lost *atomic.Int32
}

func (m lostAck) Ack() error {
	if m.lost != nil {
		m.lost.Add(1)
	}
	return nil
}

// A batch with duplicates (the same order published again) and
// redeliveries (Nak after a failure; AckWait expiring after a lost ack):
// one effect per distinct order, every duplicate acknowledged.
func TestBatchWithDuplicatesAndRedeliveries(t *testing.T) {
	const distinct, dups = 300, 100
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	effects := map[string]int{}
	failedOnce := map[string]bool{}
	var outs consumertest.Outcomes
	h, err := New(g, func(ctx context.Context, msg consumerx.Message) error {
		order := msg.Metadata["Order-Id"]
		var i int
		fmt.Sscanf(order, "order-%d", &i)
		mu.Lock()
		defer mu.Unlock()
		if i%5 == 0 && !failedOnce[order] { // every fifth order fails once
			failedOnce[order] = true
			return errors.New("gateway timeout")
		}
		effects[order]++
		return nil
	}, Options{Group: "billing", InProgressDelay: 50 * time.Millisecond, Process: consumerx.Options{
		Key:       func(msg consumerx.Message) (string, error) { return msg.Metadata["Order-Id"], nil },
		Logger:    testenv.Logger(t),
		OnOutcome: outs.Hook,
	}})
	if err != nil {
		t.Fatal(err)
	}

	publish := func(i int) {
		m := nats.NewMsg(fmt.Sprintf("orders.%d", i))
		m.Header.Set("Order-Id", fmt.Sprintf("order-%d", i))
		m.Data = fmt.Appendf(nil, "charge %d", i)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for i := range distinct {
		publish(i)
		if i%3 == 0 && i/3 < dups {
			publish(i) // the same order again, as a new stream message
		}
	}

	// Every seventh stream message loses its first ack.
	var lost atomic.Int32
	var dropped sync.Map
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var inflight sync.WaitGroup
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			inflight.Add(1)
			defer inflight.Done()
			md, _ := msg.Metadata()
			if md.Sequence.Stream%7 == 0 {
				if _, seen := dropped.LoadOrStore(md.Sequence.Stream, true); !seen {
					msg = lostAck{msg, &lost}
				}
			}
			_, _ = h.Handle(runCtx, msg)
		})
		if err != nil {
			done <- err
			return
		}
		<-runCtx.Done()
		cc.Stop()
		<-cc.Closed()
		inflight.Wait()
		done <- nil
	}()

	testenv.WaitFor(t, 30*time.Second, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		if err != nil || info.NumAckPending != 0 || info.NumPending != 0 {
			return false
		}
		all := outs.All()
		return all[consumerx.Processed] == distinct && all[consumerx.Duplicate] >= dups+int(lost.Load())
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)

	mu.Lock()
	defer mu.Unlock()
	if len(effects) != distinct {
		t.Errorf("%d distinct orders ran, want %d", len(effects), distinct)
	}
	for order, n := range effects {
		if n != 1 {
			t.Errorf("%s ran %d times", order, n)
		}
	}
	all := outs.All()
	if all[consumerx.Failed] < distinct/5 || lost.Load() == 0 {
		t.Errorf("outcomes = %v, lost acks = %d: the batch had too few redeliveries to prove anything", all, lost.Load())
	}
	t.Logf("outcomes %v, lost acks %d", all, lost.Load())
}

// Consume returns after its context is cancelled and, with the server
// shut down, no goroutine is left. Messages are keyed by default by their
// stream sequence: a redelivered one is a duplicate.
func TestConsumeStopsAndDefaultKey(t *testing.T) {
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
	var effects atomic.Int32
	var outs consumertest.Outcomes
	var ids sync.Map
	h, err := New(g, func(ctx context.Context, msg consumerx.Message) error { effects.Add(1); return nil },
		Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t),
			OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
				ids.Store(msg.ID, true)
				outs.Hook(ctx, msg, o, err)
			}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	// A first delivery whose ack is lost, by hand.
	batch, err := cons.Fetch(1)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if o, err := h.Handle(ctx, lostAck{msg, nil}); o != consumerx.Processed || err != nil {
			t.Fatalf("first delivery: %s, %v", o, err)
		}
		if err := msg.Nak(); err != nil { // redeliver now rather than after AckWait
			t.Fatal(err)
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Consume(runCtx, cons) }()
	testenv.WaitFor(t, 10*time.Second, "the redelivery", func() bool { return outs.All()[consumerx.Duplicate] == 1 })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Consume did not return")
	}
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	if effects.Load() != 1 {
		t.Errorf("effects = %d, want 1", effects.Load())
	}
	n := 0
	ids.Range(func(k, _ any) bool {
		n++
		if k != "ORDERS:1" {
			t.Errorf("message id %q, want ORDERS:1 (stream:sequence)", k)
		}
		return true
	})
	if n != 1 {
		t.Errorf("%d message ids, want 1", n)
	}
}

// A consumer whose MaxDeliver would give up on a failing message before
// its attempts ran out is refused: the server would drop the message, and
// it would never be dead-lettered. One above the attempts is accepted.
func TestConsumeRefusesMaxDeliverBelowAttempts(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, stopNATS := startNATS(t)
	defer stopNATS()
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(g, func(context.Context, consumerx.Message) error { return nil },
		Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: 3}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		maxDeliver int
		refused    bool
	}{{2, true}, {3, true}, {4, false}, {-1, false}} {
		cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable: fmt.Sprintf("billing%d", tc.maxDeliver+1), AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: tc.maxDeliver})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err = h.Consume(runCtx, cons)
		cancel()
		if refused := err != nil && strings.Contains(err.Error(), "MaxDeliver"); refused != tc.refused {
			t.Errorf("MaxDeliver %d with 3 attempts: Consume = %v, want refused %v", tc.maxDeliver, err, tc.refused)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	h := func(context.Context, consumerx.Message) error { return nil }
	if _, err := New(g, h, Options{}); err == nil {
		t.Error("New accepted an empty group")
	}
	if _, err := New(g, nil, Options{Group: "g"}); err == nil {
		t.Error("New accepted a nil handler")
	}
	if _, err := New(nil, h, Options{Group: "g"}); err == nil {
		t.Error("New accepted a nil guard")
	}
	if _, err := New(g, h, Options{Group: "g", RetryDelay: -1}); err == nil {
		t.Error("New accepted a negative delay")
	}
}
