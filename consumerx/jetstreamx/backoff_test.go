package jetstreamx

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
//
// Consume reports every third of the shortest value: a machine that holds
// the process back for two thirds of it (make test's load, under -race:
// seen with 500 ms) has the server redeliver, rightly. A redelivery after
// the server heard nothing of the message for over half the value (its
// delivery, a report, its ack, as another subscriber of the server sees
// them) proves nothing, and the case runs again with a BackOff twice as
// long; a redelivery while the reports came on time fails at once.
func TestConsumeBackOffShorterThanAckWaitNotRedelivered(t *testing.T) {
	testenv.OnTime(t, "a shortest BackOff", 500*time.Millisecond, 3, func(shortest time.Duration) bool {
		return backOffNotRedelivered(t, shortest)
	})
}

// backOffNotRedelivered runs the case with shortest as the BackOff's later
// value; late reports a redelivery that followed a silence of over half
// of it.
func backOffNotRedelivered(t *testing.T, shortest time.Duration) (late bool) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{BackOff: []time.Duration{10 * shortest, shortest}})
	if info := cons.CachedInfo(); info.Config.AckWait != 10*shortest {
		t.Fatalf("AckWait %s, want BackOff[0] %s", info.Config.AckWait, 10*shortest)
	}
	var heard ackTimeline
	sub, err := js.Conn().Subscribe(">", heard.add)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
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
	stop := consumeAll(t, h, cons, 1)
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
	var redelivered []uint64
	for m := range again.Messages() {
		md, _ := m.Metadata()
		redelivered = append(redelivered, md.NumDelivered)
	}
	testenv.WaitFor(t, 10*time.Second, "the message processed and acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && outs.Final()[consumerx.Processed] == 1 && info.NumAckPending == 0 && info.NumPending == 0
	})
	stop()
	_ = sub.Unsubscribe()
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	if len(redelivered) > 0 {
		silence, events := heard.longestSilence(2)
		if silence > shortest/2 {
			t.Logf("redelivered (delivery %v) after the server heard nothing of delivery 2 for %s, reports due every %s: %v",
				redelivered, silence.Round(time.Millisecond), inProgressEvery(cons.CachedInfo().Config), events)
			return true
		}
		t.Errorf("redelivered while its handler ran (delivery %v; the handler's was %d), the longest silence %s: %v",
			redelivered, delivery.Load(), silence.Round(time.Millisecond), events)
	}
	if runs.Load() != 1 || delivery.Load() != 2 {
		t.Fatalf("%d runs, the first on delivery %d; want one run, of the second delivery", runs.Load(), delivery.Load())
	}
	return false
}

// ackTimeline records, as a subscriber to every subject sees them, when
// the durable's messages were delivered and when their acks and reports
// (to the delivery's reply subject) came.
type ackTimeline struct {
	mu     sync.Mutex
	events []ackEvent
}

type ackEvent struct {
	at      time.Time
	subject string // the delivery's reply subject, or the ack's subject
	what    string // "delivery N", "+WPI", "+ACK", "-NAK"
}

func (a *ackTimeline) add(m *nats.Msg) {
	e := ackEvent{at: time.Now()}
	switch {
	case strings.HasPrefix(m.Subject, "$JS.ACK.ORDERS.billing."):
		e.subject, e.what = m.Subject, string(m.Data)
	case strings.HasPrefix(m.Reply, "$JS.ACK.ORDERS.billing."):
		md, err := m.Metadata()
		if err != nil {
			return
		}
		e.subject, e.what = m.Reply, fmt.Sprintf("delivery %d", md.NumDelivered)
	default:
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, e)
}

// longestSilence returns the longest time between the n-th delivery, the
// reports and ack sent to its reply subject, and the next delivery (or
// the ack, if none came), and those events with their times from the
// delivery.
func (a *ackTimeline) longestSilence(n uint64) (time.Duration, []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var (
		subject string
		from    time.Time
		prev    time.Time
		longest time.Duration
		seen    []string
	)
	for _, e := range a.events {
		if subject == "" {
			if e.what == fmt.Sprintf("delivery %d", n) {
				subject, from, prev = e.subject, e.at, e.at
				seen = append(seen, e.what+" at 0s")
			}
			continue
		}
		next := strings.HasPrefix(e.what, "delivery ")
		if e.subject != subject && !next {
			continue
		}
		longest = max(longest, e.at.Sub(prev))
		prev = e.at
		seen = append(seen, fmt.Sprintf("%s at %s", e.what, e.at.Sub(from).Round(time.Millisecond)))
		if next || e.what == "+ACK" {
			break
		}
	}
	return longest, seen
}
