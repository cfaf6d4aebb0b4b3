package kafkax

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A waiting rebalance stops A's poll of "ok1", "bad", "ok2" while "bad"
// (its one attempt used) waits in place for its dead letter, which A could
// not send (Failed, not acknowledged): only "ok1" is committed, "bad" is
// not counted as done. B, owning the partition once A leaves, sends the
// dead letter once and runs "ok2"; every effect happens once (evidence for
// the acknowledged prefix: green, not a bug).
func TestWaitingRebalanceDeadLetterFailedNotCommitted(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	addrs := cluster.ListenAddrs()
	producer, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	ctx := context.Background()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("ok1")},
		&kgo.Record{Topic: "orders", Value: []byte("bad")}, &kgo.Record{Topic: "orders", Value: []byte("ok2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	var (
		mu         sync.Mutex
		effects    = map[string]int{}
		deadTries  atomic.Int32 // A's dead letters of "bad", all failed
		deadSent   atomic.Int32 // B's, sent
		assignedB  atomic.Int32
		runA, runB = make(chan error, 1), make(chan error, 1)
	)
	h := func(_ context.Context, msg consumerx.Message) error {
		if string(msg.Payload) == "bad" {
			return errors.New("card declined")
		}
		mu.Lock()
		defer mu.Unlock()
		effects[string(msg.Payload)]++
		return nil
	}
	member := func(dead func(context.Context, consumerx.Message, error) error, opts ...kgo.Opt) (*kgo.Client, *Consumer) {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
			kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
			kgo.FetchMaxWait(100 * time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.RebalanceTimeout(30 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
			OnPartitionsRevoked(nil), OnPartitionsLost(nil), OnPartitionsCallbackBlocked(nil)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(cl, g, h, Options{RetryDelay: time.Hour, Process: consumerx.Options{MaxAttempts: 1, DeadLetter: dead, Logger: testenv.Logger(t)}})
		if err != nil {
			cl.Close()
			t.Fatal(err)
		}
		return cl, c
	}
	clA, a := member(func(context.Context, consumerx.Message, error) error {
		deadTries.Add(1)
		return errors.New("dead-letter topic unavailable")
	})
	defer clA.Close()
	ctxA, stopA := context.WithCancel(ctx)
	defer stopA()
	go func() { runA <- a.Run(ctxA) }()
	testenv.WaitFor(t, 10*time.Second, "A's dead letter of bad failed", func() bool { return deadTries.Load() > 0 })

	clB, b := member(func(context.Context, consumerx.Message, error) error {
		deadSent.Add(1)
		return nil
	}, kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { assignedB.Add(1) }))
	defer clB.Close()
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	go func() { runB <- b.Run(ctxB) }()
	testenv.WaitFor(t, 10*time.Second, "the rebalance done well before its timeout", func() bool { return assignedB.Load() > 0 })
	if n := lag(t, producer, "billing", "orders"); n != 2 {
		t.Errorf("lag after the rebalance = %d, want 2 (ok1 committed; bad, its dead letter not sent, and ok2 not)", n)
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
	if effects["ok1"] != 1 || effects["ok2"] != 1 || deadSent.Load() != 1 {
		t.Errorf("effects %v, dead letters sent %d; want each ok once, one dead letter", effects, deadSent.Load())
	}
}
