package kafkax

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A record whose group members are stopped mid-handler more times than
// MaxAttempts is still processed exactly once, by the member that fetches
// it next, and nothing is dead-lettered.
func TestShutdownIsNotFailure(t *testing.T) {
	const maxAttempts, stops = 2, 3
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	addrs, producer, stopKafka := startKafka(t, "orders")
	ctx := context.Background()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("order-1"), Value: []byte("charge 1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	h := consumertest.NewInterrupted(stops)
	var outs consumertest.Outcomes
	var dead atomic.Int32
	member := func() (*kgo.Client, *Consumer) {
		cl := groupClient(t, addrs, "billing", "orders")
		c, err := New(cl, g, h.Handle, Options{RetryDelay: 5 * time.Millisecond, Process: consumerx.Options{
			MaxAttempts: maxAttempts, Logger: testenv.Logger(t), OnOutcome: outs.Hook,
			DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }}})
		if err != nil {
			t.Fatal(err)
		}
		return cl, c
	}
	run := func(c *Consumer) (stop func()) {
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}
	for range stops {
		cl, c := member()
		stop := run(c)
		h.WaitStarted(t, 20*time.Second)
		stop()                      // the member shuts down mid-handler (or loses the partition)
		cl.CloseAllowingRebalance() // and leaves the group
	}
	cl, c := member()
	stop := run(c)
	testenv.WaitFor(t, 20*time.Second, "the record processed and committed", func() bool {
		return h.Effects.Load() == 1 && lag(t, producer, "billing", "orders") == 0
	})
	stop()
	cl.CloseAllowingRebalance()
	stopKafka()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)
	all := outs.All()
	if h.Effects.Load() != 1 || dead.Load() != 0 || all[consumerx.Interrupted] != stops || all[consumerx.Processed] != 1 ||
		all[consumerx.DeadLettered] != 0 || all[consumerx.Failed] != 0 {
		t.Fatalf("effects %d, dead letters %d, outcomes %v; want 1 effect, %d interrupted, nothing dead",
			h.Effects.Load(), dead.Load(), all, stops)
	}
}
