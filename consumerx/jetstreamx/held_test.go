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
)

// A consumer claimed a message and died (its claim stays pending until
// its lease runs out); JetStream redelivers the message to another, which
// finds it in progress. Each Nak of it counts toward the consumer's
// MaxDeliver, which Consume accepts when it is above the attempts: Nak'ed
// every InProgressDelay for the rest of the dead holder's lease, the
// message would spend them and be dropped by the server, its effect never
// run. Nak'ed until the lease ends, it is taken over then, and runs once.
func TestMessageHeldByDeadConsumerOutlivesItsLease(t *testing.T) {
	const maxDeliver, delay, lease = 10, 100 * time.Millisecond, 2 * time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{})
	dead := guard.New(g.Store(), guard.Options{Lease: lease})
	js, _ := startNATS(t)
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{MaxDeliver: maxDeliver})
	var (
		effects, held atomic.Int32
		outs          consumertest.Outcomes
	)
	h, err := New(g, func(context.Context, consumerx.Message) error { effects.Add(1); return nil },
		Options{Group: "billing", MaxWait: 50 * time.Millisecond, InProgressDelay: delay,
			Process: consumerx.Options{Logger: testenv.Logger(t),
				OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
					if o == consumerx.InProgress && errors.Is(err, guard.ErrInProgress) {
						held.Add(1)
					}
					outs.Hook(ctx, msg, o, err)
				}}})
	if err != nil {
		t.Fatal(err)
	}
	publishHeldByDead(t, js, h, dead)
	stop := consumeAll(t, h, cons, 1)
	defer stop()
	deadline := time.Now().Add(3 * lease)
	for outs.Final()[consumerx.Processed] == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling an outcome, not synchronising
	}
	if effects.Load() != 1 || outs.Final()[consumerx.Processed] != 1 {
		t.Fatalf("%d effects, deliveries %v (%d found in progress) within %s of a dead holder's claim with a %s lease; "+
			"want the message taken over and run once", effects.Load(), outs.All(), held.Load(), 3*lease, lease)
	}
}
