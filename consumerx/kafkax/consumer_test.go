package kafkax

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startKafka starts an in-process kfake cluster with the topic, and a
// producer client; stop closes both.
func startKafka(t *testing.T, topics ...string) (addrs []string, producer *kgo.Client, stop func()) {
	t.Helper()
	_, addrs, producer, stop = startKafkaCluster(t, 3, topics...)
	return addrs, producer, stop
}

// startKafkaCluster is startKafka with the partitions of each topic
// chosen, returning the cluster too (for its ControlKey); stop, also
// registered with t.Cleanup, closes the producer, then the cluster.
func startKafkaCluster(t *testing.T, partitions int32, topics ...string) (cluster *kfake.Cluster, addrs []string, producer *kgo.Client, stop func()) {
	t.Helper()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topics...))
	if err != nil {
		t.Fatal(err)
	}
	addrs = cluster.ListenAddrs()
	producer, err = kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		cluster.Close()
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			producer.Close()
			cluster.Close()
		})
	}
	t.Cleanup(stop)
	return cluster, addrs, producer, stop
}

// partitionProducer returns a producer that writes each record to the
// partition the record names and sends only when produceTogether flushes
// it (kgo.ManualFlushing); it is closed with the test.
func partitionProducer(t *testing.T, addrs []string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ManualFlushing())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// produceTogether produces recs through cl (a partitionProducer) in one
// produce request once cl knows their topic, so that a fetch holds all of
// them or none of them. A ProduceSync sends what is buffered when its
// first partition's linger (10ms) ends: one whose goroutine stalls that
// long (a loaded machine) sends its first partitions' records alone, and
// a member's poll between the two requests holds those partitions alone.
func produceTogether(t *testing.T, cl *kgo.Client, recs ...*kgo.Record) {
	t.Helper()
	ctx := context.Background()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	wg.Add(len(recs))
	for _, r := range recs {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			defer wg.Done()
			mu.Lock()
			defer mu.Unlock()
			if first == nil {
				first = err
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
}

func groupClient(t *testing.T, addrs []string, group, topic string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// With BlockRebalanceOnPoll they run between polls: they must not
		// hold up a rebalance, a Close or a Run.
		OnPartitionsRevoked(nil), OnPartitionsLost(nil), OnPartitionsCallbackBlocked(nil))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// lag is the records of topic the group has not committed, or -1 while
// the group is not known yet.
func lag(t *testing.T, producer *kgo.Client, group, topic string) int64 {
	t.Helper()
	ctx := context.Background()
	adm := kadm.NewClient(producer)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	committed, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return -1
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) {
		c, _ := committed.Lookup(o.Topic, o.Partition)
		n += o.Offset - max(c.At, 0)
	})
	return n
}

// A batch with duplicates (the same order produced again) and
// redeliveries (a member that dies before committing, a failure retried in
// place): one effect per distinct order.
func TestBatchWithDuplicatesAndRedeliveries(t *testing.T) {
	const distinct, dups = 300, 100
	g, _, _ := consumertest.Guard(t, guard.Options{})
	snapshot := goleak.IgnoreCurrent()
	addrs, producer, stopKafka := startKafka(t, "orders")
	ctx := context.Background()
	var records []*kgo.Record
	for i := range distinct {
		r := &kgo.Record{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", i), Value: fmt.Appendf(nil, "charge %d", i)}
		records = append(records, r)
		if i%3 == 0 && i/3 < dups {
			records = append(records, &kgo.Record{Topic: "orders", Key: r.Key, Value: r.Value})
		}
	}
	if err := producer.ProduceSync(ctx, records...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	effects := map[string]int{}
	failedOnce := map[string]bool{}
	handler := func(crash func()) consumerx.Handler {
		return func(ctx context.Context, msg consumerx.Message) error {
			order := string(msg.Raw.(*kgo.Record).Key)
			var i int
			fmt.Sscanf(order, "order-%d", &i)
			mu.Lock()
			defer mu.Unlock()
			if i%5 == 0 && !failedOnce[order] { // fails once, retried in place
				failedOnce[order] = true
				return errors.New("gateway timeout")
			}
			effects[order]++
			if crash != nil && len(effects) == 100 {
				crash()
			}
			return nil
		}
	}
	var outs consumertest.Outcomes
	var seenByA sync.Map
	popts := consumerx.Options{
		Key:       func(msg consumerx.Message) (string, error) { return string(msg.Raw.(*kgo.Record).Key), nil },
		Logger:    testenv.Logger(t),
		OnOutcome: outs.Hook,
	}

	// Member A processes 100 orders and dies before committing its poll.
	clA := groupClient(t, addrs, "billing", "orders")
	ctxA, crash := context.WithCancel(ctx)
	aopts := popts
	aopts.OnOutcome = func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
		seenByA.Store(msg.ID, true)
		outs.Hook(ctx, msg, o, err)
	}
	a, err := New(clA, g, handler(crash), Options{Process: aopts, MaxPollRecords: 50, RetryDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Run(ctxA); err != nil {
		t.Fatal(err)
	}
	clA.CloseAllowingRebalance()

	// Member B finishes the topic.
	clB := groupClient(t, addrs, "billing", "orders")
	var redelivered atomic.Int32
	bopts := popts
	bopts.OnOutcome = func(ctx context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
		if _, ok := seenByA.Load(msg.ID); ok && o == consumerx.Duplicate {
			redelivered.Add(1)
		}
		outs.Hook(ctx, msg, o, err)
	}
	b, err := New(clB, g, handler(nil), Options{Process: bopts, MaxPollRecords: 50, RetryDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctxB, stopB := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(ctxB) }()
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool {
		return lag(t, producer, "billing", "orders") == 0
	})
	stopB()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	clB.CloseAllowingRebalance()
	stopKafka()
	goleak.VerifyNone(t, snapshot, testenv.ClientGoroutines)

	mu.Lock()
	defer mu.Unlock()
	if len(effects) != distinct {
		t.Errorf("%d distinct orders ran, want %d", len(effects), distinct)
	}
	for order, n := range effects {
		if n != 1 {
			t.Errorf("%s ran %d times", order, n)
		}
	}
	all := outs.All()
	// A first failure that A's handler returns after A was stopped counts
	// as interrupted (shutdown is not failure), and B's retry then
	// succeeds: together they are at least one per failing order.
	if all[consumerx.Processed] != distinct || all[consumerx.Duplicate] < dups ||
		all[consumerx.Failed]+all[consumerx.Interrupted] < distinct/5 || redelivered.Load() == 0 {
		t.Errorf("outcomes = %v, redelivered to B = %d; want %d processed, ≥ %d duplicates, ≥ %d failed or interrupted, some redelivered",
			all, redelivered.Load(), distinct, dups, distinct/5)
	}
	t.Logf("outcomes %v, redelivered after A died: %d", all, redelivered.Load())
}

// A record that always fails is produced to the dead-letter topic once,
// after MaxAttempts runs in place, and its offset is committed.
func TestAlwaysFailsProducedToDeadLetter(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders", "orders.dead")
	ctx := context.Background()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("order-1"), Value: []byte("charge 1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var calls atomic.Int32
	c, err := New(cl, g, func(context.Context, consumerx.Message) error {
		return fmt.Errorf("card declined #%d", calls.Add(1))
	}, Options{RetryDelay: 5 * time.Millisecond, Process: consumerx.Options{MaxAttempts: 3, Logger: testenv.Logger(t),
		DeadLetter: ProduceDeadLetter(producer, "orders.dead")}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "the record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 {
		t.Errorf("handler ran %d times, want 3", calls.Load())
	}
	reader, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics("orders.dead"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	recs := reader.PollFetches(pctx).Records()
	if len(recs) != 1 {
		t.Fatalf("dead-letter topic has %d records, want 1", len(recs))
	}
	r := recs[0]
	headers := map[string]string{}
	for _, h := range r.Headers {
		headers[h.Key] = string(h.Value)
	}
	if string(r.Key) != "order-1" || string(r.Value) != "charge 1" || !strings.Contains(headers[HeaderDeadReason], "card declined #3") ||
		!strings.HasPrefix(headers[HeaderDeadSource], "orders/") {
		t.Errorf("dead letter = %q %q %v", r.Key, r.Value, headers)
	}
}

func TestNewRejectsBadClients(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	h := func(context.Context, consumerx.Message) error { return nil }
	for name, opts := range map[string][]kgo.Opt{
		"no group":   {kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("t")},
		"autocommit": {kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumeTopics("t"), kgo.ConsumerGroup("g")},
	} {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(cl, g, h, Options{}); err == nil {
			t.Errorf("%s: New accepted the client", name)
		}
		cl.Close()
	}
}
