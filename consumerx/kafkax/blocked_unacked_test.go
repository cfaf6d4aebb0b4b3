package kafkax

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A waiting rebalance stops A's poll of "ok1", "bad", "ok2" while "bad"
// waits to be retried in place, not acknowledged: its one attempt used,
// its dead letter could not be sent (Failed); or it failed, then its
// handler called runtime.Goexit (the partition taken up again from "ok1",
// now a Duplicate), then it failed again. Only "ok1" is committed: "bad"
// is not counted as done, and a respawned partition counts its
// acknowledged records from the first again, not on from where it was. B,
// owning the partition once A leaves, runs "bad" (or sends its dead
// letter) once and runs "ok2"; every effect happens once (evidence for
// the acknowledged prefix: green, not a bug; red if a Failed record
// counted as acknowledged, or a respawned partition counted on).
func TestWaitingRebalanceUnacknowledgedNotCommitted(t *testing.T) {
	for _, mode := range []string{"dead letter failed", "goexit then failed"} {
		t.Run(mode, func(t *testing.T) { unacknowledgedNotCommitted(t, mode == "goexit then failed") })
	}
}

func unacknowledgedNotCommitted(t *testing.T, goexit bool) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	_, addrs, producer, stopKafka := startKafkaCluster(t, 1, "orders")
	defer stopKafka()
	ctx := context.Background()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("ok1")},
		&kgo.Record{Topic: "orders", Value: []byte("bad")}, &kgo.Record{Topic: "orders", Value: []byte("ok2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var (
		mu         sync.Mutex
		effects    = map[string]int{}
		badA       atomic.Int32 // A's runs of "bad" and dead letters of it, all failed
		failedA    atomic.Int32 // A's Failed outcomes of "bad"
		deadSent   atomic.Int32 // B's dead letters, sent
		assignedB  atomic.Int32
		runA, runB = make(chan error, 1), make(chan error, 1)
	)
	h := func(a bool) consumerx.Handler {
		return func(_ context.Context, msg consumerx.Message) error {
			if string(msg.Payload) == "bad" && a {
				if badA.Add(1) == 2 && goexit {
					runtime.Goexit()
				}
				return errors.New("card declined")
			}
			mu.Lock()
			defer mu.Unlock()
			effects[string(msg.Payload)]++
			return nil
		}
	}
	member := func(h consumerx.Handler, dead func(context.Context, consumerx.Message, error) error, failed *atomic.Int32, opts ...kgo.Opt) (*kgo.Client, *Consumer) {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
			kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
			kgo.FetchMaxWait(100 * time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.RebalanceTimeout(30 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
			OnPartitionsRevoked(nil), OnPartitionsLost(nil), OnPartitionsCallbackBlocked(nil)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		popts := consumerx.Options{MaxAttempts: -1, Logger: testenv.Logger(t)}
		if failed != nil {
			popts.OnOutcome = func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
				if string(msg.Payload) == "bad" && o == consumerx.Failed {
					failed.Add(1)
				}
			}
		}
		retry := 20 * time.Millisecond // the Goexit's partition is taken up again soon
		if !goexit {
			popts.MaxAttempts, popts.DeadLetter, retry = 1, dead, time.Hour
		}
		c, err := New(cl, g, h, Options{RetryDelay: retry, Process: popts})
		if err != nil {
			cl.Close()
			t.Fatal(err)
		}
		return cl, c
	}
	clA, a := member(h(true), func(context.Context, consumerx.Message, error) error {
		badA.Add(1)
		return errors.New("dead-letter topic unavailable")
	}, &failedA)
	defer clA.Close()
	ctxA, stopA := context.WithCancel(ctx)
	defer stopA()
	go func() { runA <- a.Run(ctxA) }()
	// Waited for by its outcome, not its run: a rebalance that stops the
	// poll while the handler returns makes that run Interrupted (no
	// attempt counted), and B would run "bad" instead of dead-lettering it.
	seen := int32(0) // A's dead letter of bad failed
	if goexit {
		seen = 1 // A failed bad again after its Goexit (which is no outcome)
	}
	testenv.WaitFor(t, 10*time.Second, "A's outcome of bad Failed", func() bool { return failedA.Load() > seen })

	clB, b := member(h(false), func(context.Context, consumerx.Message, error) error {
		deadSent.Add(1)
		return nil
	}, nil, kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { assignedB.Add(1) }))
	defer clB.Close()
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	go func() { runB <- b.Run(ctxB) }()
	testenv.WaitFor(t, 10*time.Second, "the rebalance done well before its timeout", func() bool { return assignedB.Load() > 0 })
	if n := lag(t, producer, "billing", "orders"); n != 2 {
		t.Errorf("lag after the rebalance = %d, want 2 (ok1 committed; bad and ok2 not)", n)
	}

	stopA()
	if err := <-runA; err != nil {
		t.Error(err)
	}
	clA.Close()
	testenv.WaitFor(t, 20*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stopB()
	if err := <-runB; err != nil {
		t.Error(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]int{"ok1": 1, "ok2": 1, "bad": 1}
	if !goexit {
		want["bad"] = 0
	}
	for v, n := range want {
		if effects[v] != n {
			t.Errorf("%s ran %d times, want %d (effects %v)", v, effects[v], n, effects)
		}
	}
	if n := deadSent.Load(); n != 1 && !goexit || n != 0 && goexit {
		t.Errorf("dead letters sent: %d", n)
	}
}
