package watermillx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// bus is a gochannel Pub/Sub and a router over it, stopped (and checked
// for leftover goroutines) by stop.
type bus struct {
	t        *testing.T
	pubsub   *gochannel.GoChannel
	router   *message.Router
	snapshot goleak.Option
	drains   sync.WaitGroup
}

func newBus(t *testing.T) *bus {
	t.Helper()
	b := &bus{t: t, snapshot: goleak.IgnoreCurrent()}
	b.pubsub = gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 64}, watermill.NopLogger{})
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	b.router = r
	return b
}

// subscribe collects every message published to topic.
func (b *bus) subscribe(topic string) (got func() []*message.Message) {
	ch, err := b.pubsub.Subscribe(context.Background(), topic)
	if err != nil {
		b.t.Fatal(err)
	}
	var mu sync.Mutex
	var msgs []*message.Message
	b.drains.Go(func() {
		for m := range ch {
			mu.Lock()
			msgs = append(msgs, m)
			mu.Unlock()
			m.Ack()
		}
	})
	return func() []*message.Message {
		mu.Lock()
		defer mu.Unlock()
		return append([]*message.Message(nil), msgs...)
	}
}

func (b *bus) start() {
	b.t.Helper()
	done := make(chan error, 1)
	go func() { done <- b.router.Run(context.Background()) }()
	b.t.Cleanup(func() {
		if err := b.router.Close(); err != nil {
			b.t.Errorf("router close: %v", err)
		}
		if err := <-done; err != nil {
			b.t.Errorf("router run: %v", err)
		}
		if err := b.pubsub.Close(); err != nil {
			b.t.Errorf("pubsub close: %v", err)
		}
		b.drains.Wait()
		goleak.VerifyNone(b.t, b.snapshot, testenv.ClientGoroutines)
	})
	<-b.router.Running()
}

func (b *bus) publish(topic string, msgs ...*message.Message) {
	b.t.Helper()
	if err := b.pubsub.Publish(topic, msgs...); err != nil {
		b.t.Fatal(err)
	}
}

// effects counts runs per key.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *effects) add(k string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[k]++
}

func (e *effects) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := make(map[string]int, len(e.n))
	for k, v := range e.n {
		m[k] = v
	}
	return m
}

// A batch with duplicates (the same UUID published again) and redeliveries
// (nacked after a failure): one effect per distinct message, every
// duplicate acknowledged without running, and the produced receipts
// replayed with their original UUIDs.
func TestBatchWithDuplicatesAndRedeliveries(t *testing.T) {
	const distinct, dups = 300, 100
	g, _, _ := consumertest.Guard(t, guard.Options{})
	b := newBus(t)
	var outs consumertest.Outcomes
	mw, err := New(g, Options{InProgressDelay: 20 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	b.router.AddMiddleware(mw.Middleware)
	var eff effects
	var mu sync.Mutex
	failedOnce := map[string]bool{}
	b.router.AddHandler("billing", "orders", b.pubsub, "receipts", b.pubsub, func(msg *message.Message) ([]*message.Message, error) {
		var i int
		fmt.Sscanf(string(msg.Payload), "order %d", &i)
		if i%5 == 0 { // every fifth order fails once, and is redelivered
			mu.Lock()
			first := !failedOnce[msg.UUID]
			failedOnce[msg.UUID] = true
			mu.Unlock()
			if first {
				return nil, errors.New("gateway timeout")
			}
		}
		eff.add(msg.UUID)
		return []*message.Message{message.NewMessage("receipt-"+msg.UUID, msg.Payload)}, nil
	})
	receipts := b.subscribe("receipts")
	b.start()

	orders := make([]*message.Message, distinct)
	for i := range orders {
		orders[i] = message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order %d", i))
		b.publish("orders", orders[i])
		if i%3 == 0 && i/3 < dups { // the same message again
			b.publish("orders", message.NewMessage(orders[i].UUID, orders[i].Payload))
		}
	}
	testenv.WaitFor(t, 30*time.Second, "every delivery acknowledged", func() bool {
		all := outs.All()
		return all[consumerx.Processed]+all[consumerx.Duplicate] == distinct+dups && len(receipts()) == distinct+dups
	})

	got := eff.snapshot()
	if len(got) != distinct {
		t.Errorf("%d distinct messages ran, want %d", len(got), distinct)
	}
	for _, o := range orders {
		if got[o.UUID] != 1 {
			t.Errorf("message %s ran %d times", o.UUID, got[o.UUID])
		}
	}
	all := outs.All()
	if all[consumerx.Processed] != distinct || all[consumerx.Duplicate] != dups || all[consumerx.Failed] < distinct/5 {
		t.Errorf("outcomes = %v, want %d processed, %d duplicates, at least %d failed", all, distinct, dups, distinct/5)
	}
	seen := map[string]bool{}
	for _, r := range receipts() {
		seen[r.UUID] = true
	}
	if len(seen) != distinct {
		t.Errorf("receipts carry %d distinct UUIDs, want %d (replays keep the UUID)", len(seen), distinct)
	}
}

// Unlike Watermill's Deduplicator, a handler error does not mark the
// message done: it is nacked, runs again and is then recorded.
func TestHandlerErrorDoesNotMarkDone(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	b := newBus(t)
	var outs consumertest.Outcomes
	mw, err := New(g, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	calls, effects := 0, 0
	h := b.router.AddConsumerHandler("billing", "orders", b.pubsub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 1 {
			return errors.New("database down")
		}
		effects++
		return nil
	})
	h.AddMiddleware(mw.Middleware)
	b.start()
	msg := message.NewMessage(watermill.NewUUID(), []byte("order 1"))
	b.publish("orders", msg)
	proc, _ := mw.processor("billing")
	key, _ := proc.Key(consumerx.Message{ID: msg.UUID})
	testenv.WaitFor(t, 10*time.Second, "the message completed", func() bool {
		rec, err := g.Get(context.Background(), key)
		return err == nil && rec.State == guard.StateCompleted
	})
	b.publish("orders", message.NewMessage(msg.UUID, msg.Payload)) // and a duplicate
	testenv.WaitFor(t, 10*time.Second, "the duplicate", func() bool { return outs.All()[consumerx.Duplicate] == 1 })
	rec, err := g.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 || effects != 1 || rec.Attempt != 2 {
		t.Errorf("calls = %d, effects = %d, attempts = %d; want 2, 1, 2", calls, effects, rec.Attempt)
	}
}

// A message that always fails is published to the dead-letter topic once,
// after MaxAttempts runs, with its last error, and acknowledged.
func TestAlwaysFailsPublishedToDeadLetter(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	b := newBus(t)
	var mu sync.Mutex
	calls := 0
	var outs consumertest.Outcomes
	publish := PublishDeadLetter(b.pubsub, "orders.dead")
	deadLetters := 0
	mw, err := New(g, Options{Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: 3, OnOutcome: outs.Hook,
		DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			mu.Lock()
			deadLetters++
			mu.Unlock()
			return publish(ctx, msg, cause)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	b.router.AddMiddleware(mw.Middleware)
	b.router.AddConsumerHandler("billing", "orders", b.pubsub, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		return fmt.Errorf("card declined #%d", calls)
	})
	dead := b.subscribe("orders.dead")
	b.start()
	msg := message.NewMessage(watermill.NewUUID(), []byte("order 1"))
	msg.Metadata.Set("customer", "cus_1")
	b.publish("orders", msg)
	testenv.WaitFor(t, 10*time.Second, "the dead letter", func() bool { return len(dead()) == 1 })
	b.publish("orders", message.NewMessage(msg.UUID, msg.Payload)) // redelivered after dead-lettering
	testenv.WaitFor(t, 10*time.Second, "the redelivery handled", func() bool {
		return outs.All()[consumerx.DeadLettered] == 2
	})
	d := dead()[0]
	mu.Lock()
	defer mu.Unlock()
	if calls != 3 || deadLetters != 1 {
		t.Errorf("handler ran %d times, dead letter %d times; want 3, 1", calls, deadLetters)
	}
	if d.UUID != msg.UUID || string(d.Payload) != "order 1" || d.Metadata.Get("customer") != "cus_1" ||
		!strings.Contains(d.Metadata.Get(MetadataDeadReason), "card declined #3") || d.Metadata.Get(MetadataDeadGroup) != "billing" {
		t.Errorf("dead letter = %s %q %v", d.UUID, d.Payload, d.Metadata)
	}
}

// With the middleware on the whole router, each handler is its own group:
// two handlers of one topic each run each message once.
func TestEachHandlerItsOwnGroup(t *testing.T) {
	const n = 50
	g, _, _ := consumertest.Guard(t, guard.Options{})
	b := newBus(t)
	var outs consumertest.Outcomes
	mw, err := New(g, Options{Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	b.router.AddMiddleware(mw.Middleware)
	var eff effects
	for _, name := range []string{"billing", "shipping"} {
		b.router.AddConsumerHandler(name, "orders", b.pubsub, func(msg *message.Message) error {
			eff.add(name + "/" + msg.UUID)
			return nil
		})
	}
	b.start()
	var uuids []string
	for i := range n {
		m := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "order %d", i))
		uuids = append(uuids, m.UUID)
		b.publish("orders", m, message.NewMessage(m.UUID, m.Payload))
	}
	testenv.WaitFor(t, 20*time.Second, "every delivery acknowledged", func() bool {
		all := outs.All()
		return all[consumerx.Processed]+all[consumerx.Duplicate] == 4*n
	})
	got := eff.snapshot()
	for _, u := range uuids {
		if got["billing/"+u] != 1 || got["shipping/"+u] != 1 {
			t.Errorf("message %s: billing ran %d, shipping %d times", u, got["billing/"+u], got["shipping/"+u])
		}
	}
}
