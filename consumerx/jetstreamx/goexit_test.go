package jetstreamx

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A handler that calls runtime.Goexit in a batch run one message at a
// time (Consume's default) ends Consume's goroutine inside the batch
// (consumerx.Processor.ProcessBatch), its claim released. The batch's
// in-progress reports must stop with it: reported in progress for ever,
// the message, never acknowledged, would never be redelivered (to this
// process or any other) while the process lives, and its effect would
// never happen. It comes back after AckWait and runs.
func TestConsumeGoexitMessageRedelivered(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	const ackWait = 300 * time.Millisecond
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{AckWait: ackWait})
	var runs, effects atomic.Int32
	var outs consumertest.Outcomes
	h, err := New(g, func(context.Context, consumerx.Message) error {
		if runs.Add(1) == 1 {
			runtime.Goexit() // t.FailNow in a handler, a helper that ends its goroutine
		}
		effects.Add(1)
		return nil
	}, Options{Group: "billing", MaxWait: 100 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	first := make(chan struct{})
	go func() {
		defer close(first) // Goexit runs it
		_ = h.Consume(ctx, cons)
	}()
	<-first
	if runs.Load() != 1 {
		t.Fatalf("Consume returned after %d runs, want it ended by the first run's Goexit", runs.Load())
	}
	// Another consumer (or this one, restarted) gets the message once
	// AckWait runs out after the last in-progress report. A delivery that
	// runs it may itself outlast AckWait on a loaded machine (its claim
	// and completion are round trips to Redis): the server then delivers
	// it again, and that delivery is a duplicate. What counts is that one
	// delivery processed it, and its effect ran once.
	stop := consumeAll(t, h, cons, 1)
	deadline := time.Now().Add(20 * ackWait)
	for outs.All()[consumerx.Processed] == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling an outcome, not synchronising
	}
	stop()
	if all := outs.All(); effects.Load() != 1 || all[consumerx.Processed] != 1 || len(all) != 1+min(all[consumerx.Duplicate], 1) {
		t.Fatalf("after a Goexit: %d effects, outcomes %v within %s; want the message redelivered and processed once",
			effects.Load(), outs.Entries(), 20*ackWait)
	}
}
