package jetstreamx

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// A handler that runs three times the consumer's AckWait is not
// redelivered while it runs: Consume reports its message (and the rest of
// its batch) in progress every third of AckWait. Two consumers share the
// durable, so a redelivery would reach the other one.
func TestLongHandlerNotRedelivered(t *testing.T) {
	const ackWait = 500 * time.Millisecond
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	js, stopNATS := startNATS(t)
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
	var runs, deliveries atomic.Int32
	var outs consumertest.Outcomes
	h, err := New(g, func(ctx context.Context, msg consumerx.Message) error {
		runs.Add(1)
		md, _ := msg.Raw.(jetstream.Msg).Metadata()
		if md.NumDelivered != 1 {
			t.Errorf("%s delivered %d times", msg.ID, md.NumDelivered)
		}
		if string(msg.Payload) == "slow" {
			time.Sleep(3 * ackWait) // the effect takes three AckWaits
		}
		return nil
	}, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t),
		OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
			deliveries.Add(1)
			outs.Hook(ctx, msg, o, err)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"slow", "quick", "quick too"} {
		if _, err := js.Publish(ctx, "orders.1", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	stop := consumeAll(t, h, cons, 2)
	testenv.WaitFor(t, 20*time.Second, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && runs.Load() >= 3 && info.NumAckPending == 0 && info.NumPending == 0
	})
	time.Sleep(ackWait) // a redelivery, had there been one, would come now
	stop()
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	if runs.Load() != 3 || deliveries.Load() != 3 || outs.All()[consumerx.Processed] != 3 || info.NumRedelivered != 0 {
		t.Errorf("handler ran %d times, %d deliveries %v, %d redelivered; want 3 runs, 3 processed, none redelivered",
			runs.Load(), deliveries.Load(), outs.All(), info.NumRedelivered)
	}
}

// The checkpoint through the batch path: 10,000 stream messages, 3,000
// of them an order published again, 50 consumers fetching batches of the
// same durable: 7,000 effects, every duplicate recognised, nothing pending.
func TestTenThousandWithDuplicatesFiftyConsumers(t *testing.T) {
	const distinct, dups, consumers = 7000, 3000, 50
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxAckPending: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int, 0, distinct+dups)
	for i := range distinct {
		ids = append(ids, i)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	ids = append(ids, rng.Perm(distinct)[:dups]...)
	rng.Shuffle(len(ids), func(a, b int) { ids[a], ids[b] = ids[b], ids[a] })
	// Published in chunks, each acknowledged before the next: a loaded
	// machine's server falls behind an unbounded stream of async
	// publishes and the client stalls ("too many outstanding").
	for n, i := range ids {
		m := nats.NewMsg(fmt.Sprintf("orders.%d", i))
		m.Header.Set("Order-Id", fmt.Sprintf("order-%d", i))
		m.Data = fmt.Appendf(nil, "charge %d", i)
		if _, err := js.PublishMsgAsync(m); err != nil {
			t.Fatal(err)
		}
		if (n+1)%500 != 0 && n+1 != len(ids) {
			continue
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			t.Fatal("publishing did not complete")
		}
	}

	effects := make([]atomic.Int32, distinct)
	outs := consumertest.Outcomes{ID: func(msg consumerx.Message) string {
		md, _ := msg.Raw.(jetstream.Msg).Metadata()
		return fmt.Sprint(md.Sequence.Stream)
	}}
	h, err := New(g, func(_ context.Context, msg consumerx.Message) error {
		var i int
		if _, err := fmt.Sscanf(msg.Metadata["Order-Id"], "order-%d", &i); err != nil {
			return err
		}
		effects[i].Add(1)
		return nil
	}, Options{Group: "billing", InProgressDelay: 50 * time.Millisecond, MaxWait: 200 * time.Millisecond, Process: consumerx.Options{
		Key:       func(msg consumerx.Message) (string, error) { return msg.Metadata["Order-Id"], nil },
		Logger:    testenv.Logger(t),
		OnOutcome: outs.Hook,
	}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stop := consumeAll(t, h, cons, consumers)
	testenv.WaitFor(t, 90*time.Second, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		f := outs.Final()
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && f[consumerx.Processed]+f[consumerx.Duplicate] == distinct+dups
	})
	elapsed := time.Since(start)
	stop()
	stopNATS()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)

	total := 0
	for i := range effects {
		n := int(effects[i].Load())
		total += n
		if n != 1 {
			t.Errorf("order-%d ran %d times", i, n)
		}
	}
	ran, dupOnly := 0, 0
	for id, list := range outs.Entries() {
		processed, duplicate := 0, false
		for _, o := range list {
			if o == consumerx.Processed {
				processed++
			}
			duplicate = duplicate || o == consumerx.Duplicate
		}
		switch {
		case processed == 1:
			ran++
		case processed == 0 && duplicate:
			dupOnly++
		default:
			t.Errorf("stream message %s: outcomes %v", id, list)
		}
	}
	if all := outs.All(); total != distinct || ran != distinct || dupOnly != dups || all[consumerx.DeadLettered] != 0 {
		t.Errorf("%d effects; %d messages ran, %d were duplicates (deliveries %v); want %d and %d", total, ran, dupOnly, all, distinct, dups)
	}
	t.Logf("%d messages, %d consumers: %s; deliveries %v", distinct+dups, consumers, elapsed, outs.All())
}
