package jetstreamx

import (
	"context"
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

// slowInfo is the real consumer whose first Info request is answered
// only once two in-progress reports were heard after it was sent, or not
// at all when its context ends first (a lost reply): what it saw goes to
// looked.
type slowInfo struct {
	jetstream.Consumer
	reports <-chan time.Time // when each report was heard
	looked  chan lookResult
	first   chan struct{} // closed by the first Info
}

type lookResult struct {
	heard  int           // reports heard while the request waited
	waited time.Duration // how long it waited
	lost   bool          // its context ended first
}

func (c *slowInfo) Info(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	select {
	case <-c.first:
		return c.Consumer.Info(ctx)
	default:
		close(c.first)
	}
	for drained := false; !drained; { // reports heard before the request
		select {
		case <-c.reports:
		default:
			drained = true
		}
	}
	start := time.Now()
	r := lookResult{}
	for r.heard < 2 && !r.lost {
		select {
		case <-c.reports:
			r.heard++
		case <-ctx.Done():
			r.lost = true
		}
	}
	r.waited = time.Since(start)
	c.looked <- r
	if r.lost {
		return nil, ctx.Err()
	}
	return c.Consumer.Info(ctx)
}

// Consume's look at the consumer's info while a batch runs (its AckWait
// and BackOff may be edited meanwhile) does not hold back the batch's
// in-progress reports: with the reply slow or lost (here it waits for
// two reports, up to the look's own bound of ackRefresh), the reports
// keep their pace. (The look came first in each tick, under the reports'
// lock: no report went out while it waited, and a lost reply silenced
// the batch for a second, over three times this consumer's AckWait: the
// message was redelivered while its handler ran.)
func TestInProgressNotHeldByPaceLook(t *testing.T) {
	const ackWait = 300 * time.Millisecond // reports every 100 ms
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{AckWait: ackWait})
	reports := make(chan time.Time, 1000)
	sub, err := js.Conn().Subscribe("$JS.ACK.ORDERS.billing.>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			select {
			case reports <- time.Now():
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	slow := &slowInfo{Consumer: cons, reports: reports, looked: make(chan lookResult, 1), first: make(chan struct{})}
	lookDone := make(chan struct{})
	var outs consumertest.Outcomes
	h, err := New(g, func(context.Context, consumerx.Message) error {
		// The batch lasts until the look is over: the look is asked at a
		// tick ackRefresh after Consume read the info.
		select {
		case <-lookDone:
		case <-time.After(10 * time.Second):
		}
		return nil
	}, Options{Group: "billing", MaxWait: 100 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	stop := consumeAll(t, h, slow, 1)
	var r lookResult
	select {
	case r = <-slow.looked:
	case <-time.After(10 * time.Second):
		t.Error("the consumer's info was not looked up while the batch ran")
	}
	close(lookDone)
	testenv.WaitFor(t, 10*time.Second, "the message processed", func() bool { return outs.Final()[consumerx.Processed] == 1 })
	stop()
	_ = sub.Unsubscribe()
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	t.Logf("the look waited %s and heard %d reports (lost reply: %v)", r.waited.Round(time.Millisecond), r.heard, r.lost)
	if r.lost {
		t.Errorf("%d in-progress reports heard in the %s the look at the consumer's info waited, reports due every %s (AckWait %s): the reports waited for the info",
			r.heard, r.waited.Round(time.Millisecond), inProgressEvery(cons.CachedInfo().Config), ackWait)
	}
}
