package jetstreamx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Consume's context ends while its pull waits for a message (nothing was
// ready). A message that comes during that wait is taken, and, on its
// last delivery, dead-lettered unrun: that much Consume's doc says. But
// Consume then pulled again (FetchNoWait for the rest of a batch) after
// its context had ended, taking messages that were ready, only to
// interrupt them: on a consumer with a MaxDeliver each such message spends
// a delivery, and one on its last delivery was dead-lettered
// (ErrMaxDeliver) though it never ran in it, where the next consumer's
// delivery would have run it.
//
// Five messages are on their last delivery (MaxDeliver 2, each delivered
// once before and Nak'ed after Consume's context ended, while its pull
// waited). Consume may take the first, which comes during the wait; it
// must not pull the four others after its context ended. A second Consume
// then runs the four. Before the fix: five dead letters, no run.
func TestNoPullAfterContextEnded(t *testing.T) {
	js, _ := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{MaxDeliver: 2})
	const n = 5
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("orders.%d", i), fmt.Appendf(nil, "charge %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Their first delivery, held unacknowledged until Consume's pull waits.
	first, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var held []jetstream.Msg
	for m := range first.Messages() {
		held = append(held, m)
	}
	if len(held) != n {
		t.Fatalf("first delivery: %d messages, want %d", len(held), n)
	}

	g, _, _ := consumertest.Guard(t, guard.Options{})
	var (
		runs    atomic.Int32
		mu      sync.Mutex
		dead    []error
		outs    consumertest.Outcomes
		deliver = map[string][]uint64{} // id → NumDelivered of each delivery Consume took
	)
	h, err := New(g, func(ctx context.Context, msg consumerx.Message) error {
		runs.Add(1)
		return nil
	}, Options{Group: "billing", MaxWait: 3 * time.Second, Process: consumerx.Options{
		MaxAttempts: 1, Logger: testenv.Logger(t),
		OnOutcome: func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
			outs.Hook(ctx, msg, o, err)
			if md, merr := msg.Raw.(jetstream.Msg).Metadata(); merr == nil {
				mu.Lock()
				deliver[msg.ID] = append(deliver[msg.ID], md.NumDelivered)
				mu.Unlock()
			}
		},
		DeadLetter: func(_ context.Context, _ consumerx.Message, cause error) error {
			mu.Lock()
			defer mu.Unlock()
			dead = append(dead, cause)
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Consume(cctx, cons) }()
	testenv.WaitFor(t, 10*time.Second, "Consume's pull waiting for a message", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumWaiting > 0
	})
	cancel()
	// Back for their last delivery, in one write: the first answers the
	// waiting pull, the others are ready before Consume could ask again.
	for _, m := range held {
		if err := m.Nak(); err != nil {
			t.Fatal(err)
		}
	}
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Consume: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Consume did not return")
	}
	mu.Lock()
	taken, deadAtStop := len(deliver), len(dead)
	mu.Unlock()

	// The next consumer runs what the stopped one left.
	stop := consumeAll(t, h, cons, 1)
	testenv.WaitFor(t, 10*time.Second, "every message run or dead-lettered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return int(runs.Load())+len(dead) >= n
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	if taken > 1 {
		t.Errorf("Consume took %d messages after its context ended (deliveries %v, outcomes %v), want at most the one that came during its wait",
			taken, deliver, outs.All())
	}
	if deadAtStop > 1 || len(dead) > 1 {
		t.Errorf("%d messages dead-lettered at their last delivery by the stopped Consume (%d in all: %v) and %d run, want at most 1 dead-lettered and the rest run",
			deadAtStop, len(dead), dead, runs.Load())
	}
	for _, c := range dead {
		if !errors.Is(c, ErrMaxDeliver) {
			t.Errorf("dead letter cause %v, want ErrMaxDeliver", c)
		}
	}
}
