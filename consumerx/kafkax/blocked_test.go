package kafkax

import (
	"context"
	"errors"
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

// On clients made with kgo.BlockRebalanceOnPoll and kafkax's
// OnPartitionsCallbackBlocked, member A's poll holds "ok1", "poison" and
// "ok2" of the one partition; "poison" fails for ever (no attempt limit,
// retried in place after an hour) or its handler waits on its context.
// B joins: the rebalance waits for A's poll, which stops at once (the
// rebalance timeout is 30s, the wait for it 10s): the poison's handler
// sees ErrRebalancing (Interrupted, its claim released) or its in-place
// retry ends, "ok1" is committed, and the rebalance runs without A
// falling out of the group (its OnPartitionsLost is not called). A member
// that keeps the partition fetches it again from "poison", not on past
// "ok2". Then A stops; B owns the partition, fetches from "poison" (not
// "ok1": it was committed) and runs the rest ("ok3" produced after the
// rebalance too). Every record's effect happens once.
func TestWaitingRebalanceStopsThePoll(t *testing.T) {
	for _, mode := range []string{"fails for ever", "hangs"} {
		t.Run(mode, func(t *testing.T) { waitingRebalance(t, mode == "hangs") })
	}
}

func waitingRebalance(t *testing.T, hang bool) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	_, addrs, producer, stopKafka := startKafkaCluster(t, 1, "orders")
	defer stopKafka()
	var (
		mu        sync.Mutex
		effects   = map[string]int{}
		outA      []consumerx.Outcome
		errA      []error
		seenByB   = map[string]bool{}
		lostA     atomic.Int32
		blockedA  atomic.Int32
		assignedB atomic.Int32
		ownedB    atomic.Int32 // partitions assigned to B
		poisonA   atomic.Int32 // A's runs of "poison"
	)
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
			kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
			kgo.FetchMaxWait(100 * time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.RebalanceTimeout(30 * time.Second), kgo.HeartbeatInterval(100 * time.Millisecond),
			OnPartitionsRevoked(nil)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	ctx := context.Background()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("ok1")},
		&kgo.Record{Topic: "orders", Value: []byte("poison")}, &kgo.Record{Topic: "orders", Value: []byte("ok2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	clA := client(OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) { lostA.Add(1) }),
		OnPartitionsCallbackBlocked(func(context.Context, *kgo.Client) { blockedA.Add(1) }))
	defer clA.Close()
	a, err := New(clA, g, func(ctx context.Context, msg consumerx.Message) error {
		if string(msg.Payload) == "poison" {
			poisonA.Add(1)
			if hang {
				<-ctx.Done()
				return context.Cause(ctx)
			}
			return errors.New("card declined")
		}
		mu.Lock()
		defer mu.Unlock()
		effects[string(msg.Payload)]++
		return nil
	}, Options{RetryDelay: time.Hour, Process: consumerx.Options{MaxAttempts: -1, Logger: testenv.Logger(t),
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
			if string(msg.Payload) == "poison" {
				mu.Lock()
				defer mu.Unlock()
				outA, errA = append(outA, o), append(errA, err)
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctxA, stopA := context.WithCancel(ctx)
	defer stopA()
	doneA := make(chan error, 1)
	go func() { doneA <- a.Run(ctxA) }()
	// Failing, waited for by its outcome, not its run: a rebalance that
	// stops the poll before the handler returns makes that run Interrupted.
	testenv.WaitFor(t, 10*time.Second, "A running the poison", func() bool {
		if hang {
			return poisonA.Load() > 0
		}
		mu.Lock()
		defer mu.Unlock()
		return len(outA) > 0
	})

	clB := client(OnPartitionsLost(nil), kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		ownedB.Add(int32(len(m["orders"])))
		assignedB.Add(1)
	}))
	defer clB.Close()
	b, err := New(clB, g, func(_ context.Context, msg consumerx.Message) error {
		mu.Lock()
		defer mu.Unlock()
		effects[string(msg.Payload)]++
		return nil
	}, Options{RetryDelay: 20 * time.Millisecond, Process: consumerx.Options{MaxAttempts: -1, Logger: testenv.Logger(t),
		OnOutcome: func(_ context.Context, msg consumerx.Message, _ consumerx.Outcome, _ error) {
			mu.Lock()
			defer mu.Unlock()
			seenByB[string(msg.Payload)] = true
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	doneB := make(chan error, 1)
	go func() { doneB <- b.Run(ctxB) }()

	testenv.WaitFor(t, 10*time.Second, "the rebalance done (B assigned) well before the rebalance timeout", func() bool {
		return assignedB.Load() > 0
	})
	// A's own callback runs behind kafkax's, on kgo's goroutine: the
	// rebalance kafkax's let go on may be done before it is called.
	testenv.WaitFor(t, 10*time.Second, "A's own callback told of the waiting rebalance", func() bool { return blockedA.Load() > 0 })
	if n := lostA.Load(); n != 0 {
		t.Errorf("A lost its partitions %d times; want 0", n)
	}
	if n := lag(t, producer, "billing", "orders"); n != 2 {
		t.Errorf("lag after the rebalance = %d, want 2 (ok1 committed, poison and ok2 not)", n)
	}
	mu.Lock()
	want := consumerx.Failed
	if hang {
		want = consumerx.Interrupted
	}
	if len(outA) == 0 || outA[0] != want || hang && !errors.Is(errA[0], ErrRebalancing) {
		t.Errorf("A's poison outcomes %v (%v); want first %v (matching ErrRebalancing if it hung)", outA, errA, want)
	}
	mu.Unlock()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("ok3")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if ownedB.Load() == 0 {
		// A kept the partition: its fetch went back to the poison, not on
		// to ok3 (whose commit would pass the poison and ok2).
		testenv.WaitFor(t, 10*time.Second, "A running the poison again", func() bool { return poisonA.Load() > 1 })
	}
	t.Logf("partitions assigned to B in the rebalance: %d; A ran the poison %d times", ownedB.Load(), poisonA.Load())

	// A leaves: B owns the partition and runs the rest.
	stopA()
	if err := <-doneA; err != nil {
		t.Error(err)
	}
	clA.Close()
	testenv.WaitFor(t, 20*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stopB()
	if err := <-doneB; err != nil {
		t.Error(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, v := range []string{"ok1", "poison", "ok2", "ok3"} {
		if effects[v] != 1 {
			t.Errorf("%s ran %d times, want 1 (effects %v)", v, effects[v], effects)
		}
	}
	if seenByB["ok1"] {
		t.Errorf("B fetched ok1, committed by A before the rebalance")
	}
}

// A rebalance that begins to wait while the poll is fetched (franz-go
// tells it once the poll holds records, before Run follows them) stops
// the poll's partitions as they are added; one after the next mark does
// not.
func TestWaitingRebalanceDuringFetch(t *testing.T) {
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tr, err := track(cl)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.untrack()
	recs := []*kgo.Record{{Topic: "orders", Offset: 7}}
	since := tr.mark()
	tr.yield()
	pt := tr.add(context.Background(), "orders", 0, recs, since)
	if !errors.Is(context.Cause(pt.ctx), ErrRebalancing) {
		t.Fatalf("partition added after the waiting rebalance: context cause %v, want ErrRebalancing", context.Cause(pt.ctx))
	}
	pt.stopped.Store(true)
	commit, stopped, rewind := tr.done()
	if len(commit) != 0 || stopped || rewind["orders"][0].Offset != 7 {
		t.Errorf("done() = %v, %v, %v; want nothing to commit, not stopped, the fetch back at 7", commit, stopped, rewind)
	}
	pt = tr.add(context.Background(), "orders", 0, recs, tr.mark())
	if pt.ctx.Err() != nil {
		t.Errorf("the next poll's partition starts stopped: %v", context.Cause(pt.ctx))
	}
	tr.done()
}
