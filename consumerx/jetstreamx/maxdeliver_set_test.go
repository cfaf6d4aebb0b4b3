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

// TestMaxDeliverSetWhileRunningNaksUntilLease: Consume's doc
// says "with a MaxDeliver set, such a message [in progress elsewhere] is
// Nak'ed until the holder's lease ends, so a holder that died costs it a
// delivery or two", and "The durable's MaxDeliver may be edited while
// Consume runs". Consume asks the server for the MaxDeliver in force
// (settleLast), but decides whether to Nak until the lease (untilLease)
// once, from the handle's cached info at start. A durable given a
// MaxDeliver (6, above the 3 attempts) while Consume runs has its
// message held by a dead consumer Nak'ed every InProgressDelay: it spends
// every delivery but the last while the dead holder's lease runs, and
// its one run there, failing once (a transient error, 2 attempts left),
// is dead-lettered with ErrMaxDeliver instead of being retried. With the
// MaxDeliver known at start (control), the same story runs the effect.
func TestMaxDeliverSetWhileRunningNaksUntilLease(t *testing.T) {
	t.Run("set before Consume", func(t *testing.T) { untilLeaseStory(t, false) })
	t.Run("set while Consume runs", func(t *testing.T) { untilLeaseStory(t, true) })
}

func untilLeaseStory(t *testing.T, edit bool) {
	const lease, maxDeliver = 3 * time.Second, 6
	g, _, _ := consumertest.Guard(t, guard.Options{})
	dead := guard.New(g.Store(), guard.Options{Lease: lease})
	js, _ := startNATS(t)
	ctx := context.Background()
	first := maxDeliver
	if edit {
		first = -1
	}
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{MaxDeliver: first})
	var (
		runs, effects, deadLetters, inProgress atomic.Int32
		cause                                  atomic.Value
	)
	h, err := New(g, func(context.Context, consumerx.Message) error {
		if runs.Add(1) == 1 {
			return errors.New("gateway timeout") // transient: its first attempt fails
		}
		effects.Add(1)
		return nil
	}, Options{Group: "billing", MaxWait: 50 * time.Millisecond, InProgressDelay: 100 * time.Millisecond,
		Process: consumerx.Options{MaxAttempts: 3, Logger: testenv.Logger(t),
			OnOutcome: func(_ context.Context, _ consumerx.Message, o consumerx.Outcome, _ error) {
				if o == consumerx.InProgress {
					inProgress.Add(1)
				}
			},
			DeadLetter: func(_ context.Context, _ consumerx.Message, err error) error {
				deadLetters.Add(1)
				cause.Store(err)
				return nil
			}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consumeAll(t, h, cons, 1))
	if edit {
		stream, err := js.Stream(ctx, "ORDERS")
		if err != nil {
			t.Fatal(err)
		}
		cfg := cons.CachedInfo().Config
		cfg.MaxDeliver = maxDeliver
		if _, err := stream.UpdateConsumer(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	publishHeldByDead(t, js, h, dead)
	testenv.WaitFor(t, 20*time.Second, "the effect or a dead letter", func() bool {
		return effects.Load() > 0 || deadLetters.Load() > 0
	})
	if effects.Load() != 1 || deadLetters.Load() != 0 {
		t.Fatalf("MaxDeliver %d (edited while running: %v), a dead holder's %s lease, 3 attempts: %d InProgress outcomes while held (Naks and last-delivery waits), %d runs, %d effects, "+
			"%d dead letters (cause %v); want a delivery or two spent while held, the failed first run retried and the effect run once",
			maxDeliver, edit, lease, inProgress.Load(), runs.Load(), effects.Load(), deadLetters.Load(), cause.Load())
	}
}
