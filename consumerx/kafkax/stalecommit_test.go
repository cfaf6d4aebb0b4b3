package kafkax

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A member commits a poll of a partition a rebalance gave to another, and
// the broker takes that commit after the new owner's: the partition's
// committed offset goes back. That is what a revocation between the end
// of a poll's handlers and its commit leads to without
// kgo.BlockRebalanceOnPoll (Run's comment says so; kafkax's callbacks do
// not see it): here member A has kgo's OnPartitionsRevoked, so that its
// handler runs on through the rebalance and it commits after it, and the
// broker holds A's commit until B committed past it. The records between
// the two commits, fetched again by the member that owns the partition
// next, are found done: Duplicates, each effect once.
func TestStaleCommitRecordsFoundDone(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	cluster, addrs, producer, stopKafka := startKafkaCluster(t, 1, "orders")
	defer stopKafka()
	ctx := context.Background()
	produce := func(vals ...string) {
		t.Helper()
		var recs []*kgo.Record
		for _, v := range vals {
			recs = append(recs, &kgo.Record{Topic: "orders", Value: []byte(v)})
		}
		if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	committed := func() int64 {
		t.Helper()
		offs, err := kadm.NewClient(producer).FetchOffsets(ctx, "billing")
		if err != nil {
			return -1
		}
		o, _ := offs.Lookup("orders", 0)
		return o.At
	}
	var (
		mu         sync.Mutex
		effects    = map[string]int{}
		dups       = map[string]int{} // Duplicate outcomes by payload, any member
		holding    = make(chan struct{}, 1)
		release    = make(chan struct{})
		bCommitted = make(chan struct{})
		heldA      atomic.Bool
		assignedB  atomic.Int32
	)
	// A's commit waits at the broker until B committed past it.
	cluster.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if !strings.HasPrefix(req.(*kmsg.OffsetCommitRequest).MemberID, "z-old-") || heldA.Swap(true) {
			return nil, nil, false
		}
		cluster.SleepControl(func() { <-bCommitted })
		return nil, nil, false
	})
	handler := func(ctx context.Context, msg consumerx.Message) error {
		if string(msg.Payload) == "r0" {
			select {
			case holding <- struct{}{}:
				<-release
			default:
			}
		}
		mu.Lock()
		defer mu.Unlock()
		effects[string(msg.Payload)]++
		return nil
	}
	// The range balancer gives the one partition to the member first by
	// member id (the client id, then a uuid): B ("a-new") once it joins.
	client := func(id string, opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ClientID(id), kgo.ConsumerGroup("billing"),
			kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.Balancers(kgo.RangeBalancer()),
			kgo.FetchMaxWait(100 * time.Millisecond), kgo.HeartbeatInterval(100 * time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	run := func(cl *kgo.Client, h consumerx.Handler) (stop func()) {
		popts := consumerx.Options{Logger: testenv.Logger(t), OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
			if o == consumerx.Duplicate {
				mu.Lock()
				dups[string(msg.Payload)]++
				mu.Unlock()
			}
		}}
		c, err := New(cl, g, h, Options{RetryDelay: 20 * time.Millisecond, Process: popts})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
			cl.Close()
		}
	}

	produce("r0", "r1", "r2")
	clA := client("z-old", kgo.OnPartitionsRevoked(func(context.Context, *kgo.Client, map[string][]int32) {}))
	stopA := run(clA, handler)
	defer stopA()
	<-holding
	clB := client("a-new", OnPartitionsRevoked(nil), OnPartitionsLost(nil),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			assignedB.Add(int32(len(m["orders"])))
		}))
	stopB := run(clB, handler)
	testenv.WaitFor(t, 20*time.Second, "the partition given to B", func() bool { return assignedB.Load() > 0 })
	close(release) // A's poll ends; its commit waits at the broker
	testenv.WaitFor(t, 20*time.Second, "B past A's records", func() bool { return committed() == 3 })
	produce("r3", "r4", "r5")
	testenv.WaitFor(t, 20*time.Second, "B's commit of r3-r5", func() bool { return committed() == 6 })
	close(bCommitted)
	testenv.WaitFor(t, 20*time.Second, "A's commit taken: the offset back at 3", func() bool { return committed() == 3 })
	stopB()

	// A, the only member now, owns the partition next: r3-r5 again, found
	// done. (A second member joining here would race A for it, and both
	// could fetch them.)
	testenv.WaitFor(t, 20*time.Second, "r3-r5 found done by A", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return dups["r3"] > 0 && dups["r4"] > 0 && dups["r5"] > 0
	})
	testenv.WaitFor(t, 20*time.Second, "A's commit of r3-r5", func() bool { return committed() == 6 })
	mu.Lock()
	defer mu.Unlock()
	for _, v := range []string{"r0", "r1", "r2", "r3", "r4", "r5"} {
		if effects[v] != 1 {
			t.Errorf("%s ran %d times, want 1 (effects %v)", v, effects[v], effects)
		}
	}
}
