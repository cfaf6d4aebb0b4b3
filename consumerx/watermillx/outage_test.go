package watermillx

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// While the store refuses writes at once (out of memory here; LOADING,
// READONLY after a failover, MISCONF answer as fast) every delivery of a
// message fails before its handler runs. Nacked at once, the message
// comes straight back, and a broker that limits deliveries (a RabbitMQ
// quorum queue's delivery-limit, an SQS maxReceiveCount, a JetStream
// MaxDeliver) would spend them in a tight loop within moments of the
// outage and drop the message, neither run nor dead-lettered. Held
// InProgressDelay before the nack, the deliveries last the outage, and
// once the store is back the message runs, once.
func TestStoreOutageDoesNotSpendDeliveries(t *testing.T) {
	const limit, delay = 20, 100 * time.Millisecond
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	rdb, admin := srv.Client(), srv.Client()
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{})
	ctx := context.Background()
	b := newBus(t)
	q := newQueue(4)
	q.limit = limit
	var (
		effects, storeErr atomic.Int32
		outs              consumertest.Outcomes
	)
	mw, err := New(g, Options{Group: "billing", InProgressDelay: delay, Process: consumerx.Options{Logger: testenv.Logger(t),
		OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
			if o == consumerx.Failed && errors.Is(err, guard.ErrUnavailable) {
				storeErr.Add(1)
			}
			outs.Hook(ctx, msg, o, err)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	h := b.router.AddConsumerHandler("billing", "orders", q, func(*message.Message) error { effects.Add(1); return nil })
	h.AddMiddleware(mw.Middleware)
	t.Cleanup(func() { _ = q.Close() })                                  // after the router closed (cleanups run last first)
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil { // full: every write answers OOM
		t.Fatal(err)
	}
	b.start()
	_ = q.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("charge 1")))
	// The outage lasts half the time the broker's deliveries take at the
	// delay's pace (the outage's length, not a synchronisation).
	testenv.WaitFor(t, 10*time.Second, "deliveries failing on the store", func() bool { return storeErr.Load() >= 1 })
	time.Sleep(limit * delay / 2)
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for outs.Final()[consumerx.Processed] == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling an outcome, not synchronising
	}
	if effects.Load() != 1 || outs.Final()[consumerx.Processed] != 1 || q.dropped.Load() != 0 {
		t.Fatalf("after a store outage of %d failed deliveries: %d effects, deliveries %v, %d dropped by the broker's limit of %d; "+
			"want the message run once", storeErr.Load(), effects.Load(), outs.All(), q.dropped.Load(), limit)
	}
}
