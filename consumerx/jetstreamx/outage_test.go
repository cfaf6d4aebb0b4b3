package jetstreamx

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// While the store refuses writes at once (out of memory here; LOADING,
// READONLY after a failover, MISCONF answer as fast) every delivery of a
// message fails before its handler runs, and every Nak counts toward the
// consumer's MaxDeliver, which Consume accepts when it is above the
// attempts. A plain Nak (no RetryDelay: JetStream redelivers at once)
// would burn the deliveries in a tight loop within moments of the outage,
// and the server would then drop the message, neither run nor
// dead-lettered. Nak'ed with a delay, the deliveries last the outage, and
// once the store is back the message runs, once.
func TestStoreOutageDoesNotUseUpMaxDeliver(t *testing.T) {
	const maxDeliver, delay = 20, 100 * time.Millisecond
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	rdb, admin := srv.Client(), srv.Client()
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{MaxDeliver: maxDeliver})
	var (
		effects  atomic.Int32
		outs     consumertest.Outcomes
		storeErr atomic.Int32
	)
	h, err := New(g, func(context.Context, consumerx.Message) error { effects.Add(1); return nil },
		Options{Group: "billing", MaxWait: 50 * time.Millisecond, InProgressDelay: delay,
			Process: consumerx.Options{Logger: testenv.Logger(t),
				OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
					if o == consumerx.Failed && errors.Is(err, guard.ErrUnavailable) {
						storeErr.Add(1)
					}
					outs.Hook(ctx, msg, o, err)
				}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil { // full: every write answers OOM
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	stop := consumeAll(t, h, cons, 1)
	defer stop()
	// The outage lasts half the time MaxDeliver deliveries take at the
	// delay's pace (the outage's length, not a synchronisation).
	testenv.WaitFor(t, 10*time.Second, "deliveries failing on the store", func() bool { return storeErr.Load() >= 1 })
	time.Sleep(maxDeliver * delay / 2)
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	// The message's next delivery comes a delay after its last Nak, once
	// the pull loop asks again: seconds on a loaded machine (make test's
	// test lanes once left 5 s without one), far less than the deliveries
	// a plain Nak would have burnt meanwhile.
	deadline := time.Now().Add(30 * time.Second)
	for outs.Final()[consumerx.Processed] == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling an outcome, not synchronising
	}
	if effects.Load() != 1 || outs.Final()[consumerx.Processed] != 1 {
		t.Fatalf("after a store outage of %d failed deliveries: %d effects, deliveries %v; want the message run once "+
			"(MaxDeliver %d used up by Naks without delay?)", storeErr.Load(), effects.Load(), outs.All(), maxDeliver)
	}
}
