package jetstreamx

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
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
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// maxDeliverTest is a stream ORDERS with a durable consumer "billing"
// whose MaxDeliver is 3, the dead letters its messages get, and the
// server's MAX_DELIVERIES advisories of it: a message the server dropped.
type maxDeliverTest struct {
	js    jetstream.JetStream
	cons  jetstream.Consumer
	drops atomic.Int32

	terms chan string // reasons of the server's MSG_TERMINATED advisories

	mu     sync.Mutex
	causes []error // of the dead letters sent
}

const testMaxDeliver = 3

func newMaxDeliverTest(t *testing.T) *maxDeliverTest {
	t.Helper()
	js, _ := startNATS(t)
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{MaxDeliver: testMaxDeliver})
	m := &maxDeliverTest{js: js, cons: cons, terms: make(chan string, 16)}
	sub, err := js.Conn().Subscribe("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.ORDERS.billing",
		func(*nats.Msg) { m.drops.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	tsub, err := js.Conn().Subscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.ORDERS.billing", func(msg *nats.Msg) {
		var adv struct {
			Reason string `json:"reason"`
		}
		_ = json.Unmarshal(msg.Data, &adv)
		select {
		case m.terms <- adv.Reason:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tsub.Unsubscribe() })
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	return m
}

func (m *maxDeliverTest) deadLetter(_ context.Context, _ consumerx.Message, cause error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.causes = append(m.causes, cause)
	return nil
}

func (m *maxDeliverTest) deadLetters() []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]error(nil), m.causes...)
}

// waitDeadLetteredOrDropped waits until the message is dead-lettered or
// the server dropped it.
func (m *maxDeliverTest) waitDeadLetteredOrDropped(t *testing.T) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, "a dead letter or a MAX_DELIVERIES advisory", func() bool {
		return len(m.deadLetters()) > 0 || m.drops.Load() > 0
	})
}

// consume runs h.Consume on m's consumer until the test ends.
func (m *maxDeliverTest) consume(t *testing.T, h *Handler) {
	t.Cleanup(consumeAll(t, h, m.cons, 1))
}

// The store refuses every delivery's claim (a private Redis out of
// memory): every Nak counts toward MaxDeliver, and on the last delivery a
// Nak would have the server drop the message, its effect never run and
// nothing dead-lettered. It is dead-lettered instead, with a cause saying
// MaxDeliver was reached and the store refused, and not dropped.
func TestStoreOutageAtMaxDeliverDeadLetters(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	rdb, admin := srv.Client(), srv.Client()
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{})
	m := newMaxDeliverTest(t)
	ctx := context.Background()
	var effects atomic.Int32
	h, err := New(g, func(context.Context, consumerx.Message) error { effects.Add(1); return nil },
		Options{Group: "billing", MaxWait: 50 * time.Millisecond, InProgressDelay: 50 * time.Millisecond,
			Process: consumerx.Options{MaxAttempts: testMaxDeliver - 1, DeadLetter: m.deadLetter, Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil { // full: every write answers OOM
		t.Fatal(err)
	}
	if _, err := m.js.Publish(ctx, "orders.1", []byte("charge 1"), jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
	m.consume(t, h)
	m.waitDeadLetteredOrDropped(t)
	dl := m.deadLetters()
	if len(dl) != 1 || m.drops.Load() != 0 || effects.Load() != 0 {
		t.Fatalf("store down on every delivery: %d dead letters %v, %d dropped by the server, %d effects; "+
			"want it dead-lettered once on its last delivery, not dropped", len(dl), dl, m.drops.Load(), effects.Load())
	}
	if !errors.Is(dl[0], ErrMaxDeliver) || !errors.Is(dl[0], guard.ErrUnavailable) {
		t.Fatalf("dead-letter cause %v: want one matching ErrMaxDeliver and guard.ErrUnavailable", dl[0])
	}
}

// A handler fails every time and consumerx would allow it 5 attempts, but
// the consumer's MaxDeliver is 3: the third delivery is the last, and its
// Nak would have the server drop the message before consumerx ever
// dead-letters it. Handle, told the consumer's MaxDeliver, dead-letters
// it on that delivery (the cause matching ErrMaxDeliver and the handler's
// error) and Terms it.
func TestHandleFailingAtMaxDeliverDeadLetters(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	m := newMaxDeliverTest(t)
	ctx := context.Background()
	errDeclined := errors.New("card declined")
	var runs atomic.Int32
	h, err := New(g, func(context.Context, consumerx.Message) error { runs.Add(1); return errDeclined },
		Options{Group: "billing", MaxDeliver: testMaxDeliver,
			Process: consumerx.Options{MaxAttempts: 5, DeadLetter: m.deadLetter, Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.js.Publish(ctx, "orders.1", []byte("charge 1"), jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
	var last consumerx.Outcome
	for len(m.deadLetters()) == 0 && m.drops.Load() == 0 {
		batch, err := m.cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			if last, err = h.Handle(ctx, msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	dl := m.deadLetters()
	if len(dl) != 1 || m.drops.Load() != 0 || runs.Load() != testMaxDeliver || last != consumerx.DeadLettered {
		t.Fatalf("failing on every delivery: %d runs, %d dead letters %v, %d dropped by the server, last outcome %s; "+
			"want %d runs and one dead letter on the last delivery", runs.Load(), len(dl), dl, m.drops.Load(), last, testMaxDeliver)
	}
	if !errors.Is(dl[0], ErrMaxDeliver) || !errors.Is(dl[0], errDeclined) {
		t.Fatalf("dead-letter cause %v: want one matching ErrMaxDeliver and the handler's error", dl[0])
	}
	// Term'ed, with a reason monitoring can tell from a drop: the server
	// delivers it no more.
	select {
	case reason := <-m.terms:
		if reason != termReason {
			t.Fatalf("terminated with reason %q, want %q", reason, termReason)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no MSG_TERMINATED advisory within 5s of the dead letter: acknowledged otherwise than by Term")
	}
	batch, err := m.cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		md, _ := msg.Metadata()
		t.Fatalf("delivered again after dead-lettering: delivery %d", md.NumDelivered)
	}
}

// A live holder elsewhere runs the message (its claim kept alive) through
// all of its deliveries. On the last one, a Nak would have the server
// drop it, and dead-lettering it would report a message its holder is
// completing: Consume waits for the holder instead, and once the holder
// completes, the delivery is a Duplicate, acknowledged. The holder's
// completion stands; nothing is dead-lettered or dropped.
func TestInProgressAtMaxDeliverWaitsForHolder(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	// The holder's lease sets the deliveries' pace (each Nak waits for
	// what is left of it), and Hold extends it every third: 2s leaves a
	// loaded machine over a second to get an extension through (600ms
	// left 400ms, and the lease lapsed: the last delivery took it over).
	holder := guard.New(g.Store(), guard.Options{Lease: 2 * time.Second})
	m := newMaxDeliverTest(t)
	ctx := context.Background()
	var (
		effects  atomic.Int32
		lastHeld atomic.Bool // in progress on the last delivery
		outs     consumertest.Outcomes
	)
	h, err := New(g, func(context.Context, consumerx.Message) error { effects.Add(1); return nil },
		Options{Group: "billing", MaxWait: 50 * time.Millisecond, InProgressDelay: 50 * time.Millisecond,
			Process: consumerx.Options{MaxAttempts: testMaxDeliver - 1, DeadLetter: m.deadLetter, Logger: testenv.Logger(t),
				OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
					if md, merr := msg.Raw.(jetstream.Msg).Metadata(); merr == nil &&
						md.NumDelivered == testMaxDeliver && o == consumerx.InProgress {
						lastHeld.Store(true)
					}
					outs.Hook(ctx, msg, o, err)
				}}})
	if err != nil {
		t.Fatal(err)
	}
	payload := []byte("charge 1")
	key, err := h.Processor().Key(consumerx.Message{ID: "order-1"})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload) // the default fingerprint
	c, held, err := holder.Hold(ctx, key, base64.RawURLEncoding.EncodeToString(sum[:]))
	if err != nil || c.Status != guard.Acquired {
		t.Fatalf("the holder's claim: %+v, %v", c, err)
	}
	defer held.Stop()
	if _, err := m.js.Publish(ctx, "orders.1", payload, jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
	m.consume(t, h)
	testenv.WaitFor(t, 15*time.Second, "the last delivery in progress elsewhere, or the message dropped", func() bool {
		return lastHeld.Load() || m.drops.Load() > 0
	})
	if err := held.Complete([]byte("charged by the holder")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the last delivery settled", func() bool {
		return outs.Final()[consumerx.Duplicate] > 0 || len(m.deadLetters()) > 0 || m.drops.Load() > 0
	})
	if dl := m.deadLetters(); len(dl) != 0 || m.drops.Load() != 0 || effects.Load() != 0 || outs.Final()[consumerx.Duplicate] != 1 {
		t.Fatalf("in progress under a live holder on its last delivery: %d dead letters %v, %d dropped by the server, "+
			"%d effects here, deliveries %v; want a Duplicate once the holder completed, nothing dead-lettered or dropped",
			len(dl), dl, m.drops.Load(), effects.Load(), outs.All())
	}
	rec, err := g.Get(ctx, key)
	if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "charged by the holder" {
		t.Fatalf("the record: %+v, %v; want the holder's completion", rec, err)
	}
}

// The consumer stops while the handler runs the message's last delivery:
// the run is Interrupted (claim released, no attempt counted), which a
// Nak hands to the next delivery; but there is none, and the server would
// drop it. It is dead-lettered instead, its cause matching ErrMaxDeliver
// and the handler's error, although the consumer's context has ended.
func TestInterruptedAtMaxDeliverDeadLetters(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	m := newMaxDeliverTest(t)
	ctx := context.Background()
	errDeclined := errors.New("card declined")
	var (
		runs     atomic.Int32
		stopLast context.CancelFunc // the consumer's stop, during the last delivery
	)
	h, err := New(g, func(ctx context.Context, _ consumerx.Message) error {
		if runs.Add(1) < testMaxDeliver {
			return errDeclined
		}
		stopLast() // the consumer stops while the last delivery runs
		<-ctx.Done()
		return ctx.Err()
	}, Options{Group: "billing", MaxDeliver: testMaxDeliver,
		Process: consumerx.Options{MaxAttempts: 5, DeadLetter: m.deadLetter, Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.js.Publish(ctx, "orders.1", []byte("charge 1"), jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
	var last consumerx.Outcome
	for len(m.deadLetters()) == 0 && m.drops.Load() == 0 {
		batch, err := m.cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			hctx, stop := context.WithCancel(ctx)
			stopLast = stop
			last, err = h.Handle(hctx, msg)
			stop()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	dl := m.deadLetters()
	if len(dl) != 1 || m.drops.Load() != 0 || last != consumerx.DeadLettered || runs.Load() != testMaxDeliver {
		t.Fatalf("stopped during the last delivery: %d runs, %d dead letters %v, %d dropped by the server, last outcome %s; "+
			"want it dead-lettered, not dropped", runs.Load(), len(dl), dl, m.drops.Load(), last)
	}
	if !errors.Is(dl[0], ErrMaxDeliver) || !errors.Is(dl[0], context.Canceled) {
		t.Fatalf("dead-letter cause %v: want one matching ErrMaxDeliver and the handler's error", dl[0])
	}
}

// A consumer claimed a message and died; Handle Naks it at most until the
// dead holder's lease ends, so its deliveries may run out first. On the
// last one, the message is waited for until the lease has run out, then
// taken over and run, once: neither dropped nor dead-lettered.
func TestDeadHolderAtMaxDeliverTakenOver(t *testing.T) {
	const lease = time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{})
	dead := guard.New(g.Store(), guard.Options{Lease: lease})
	m := newMaxDeliverTest(t)
	ctx := context.Background()
	var effects atomic.Int32
	h, err := New(g, func(context.Context, consumerx.Message) error { effects.Add(1); return nil },
		Options{Group: "billing", MaxDeliver: testMaxDeliver, InProgressDelay: 50 * time.Millisecond,
			Process: consumerx.Options{MaxAttempts: 5, DeadLetter: m.deadLetter, Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	publishHeldByDead(t, m.js, h, dead)
	var outs []consumerx.Outcome
	for effects.Load() == 0 && len(m.deadLetters()) == 0 && m.drops.Load() == 0 {
		batch, err := m.cons.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for msg := range batch.Messages() {
			o, err := h.Handle(ctx, msg)
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, o)
		}
	}
	if effects.Load() != 1 || len(m.deadLetters()) != 0 || m.drops.Load() != 0 {
		t.Fatalf("held by a dead consumer through its last delivery: %d effects, %d dead letters, %d dropped by the server, "+
			"outcomes %v; want it taken over and run once", effects.Load(), len(m.deadLetters()), m.drops.Load(), outs)
	}
}
