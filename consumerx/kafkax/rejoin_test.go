package kafkax

import (
	"context"
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

// The member is idle in its poll when an eager rebalance (RangeBalancer;
// a member joins for another topic) revokes its partition and gives it
// back. The poll then returns records fetched under the new assignment,
// from the committed offset: they were not revoked. Taken for records of
// the revoked partition, they were skipped unrun and uncommitted while
// the member's fetch went on past them, and the next poll's records were
// committed: "charge 2" lost, never run. A revoked partition's skipped
// records are fetched again if the member holds it (again).
func TestPartitionGivenBackMidPollRecordsNotSkipped(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	_, addrs, producer, stopKafka := startKafkaCluster(t, 1, "orders", "other")
	defer stopKafka()
	var (
		mu      sync.Mutex
		ran     = map[string]int{}
		revoked atomic.Int32
	)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.Balancers(kgo.RangeBalancer()),
		kgo.FetchMaxWait(100*time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			if len(m["orders"]) > 0 {
				revoked.Add(1)
			}
		}), OnPartitionsLost(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		mu.Lock()
		defer mu.Unlock()
		ran[string(msg.Payload)]++
		return nil
	}, Options{RetryDelay: 20 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	produce := func(v string) {
		if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	ranOf := func(v string) int {
		mu.Lock()
		defer mu.Unlock()
		return ran[v]
	}
	produce("charge 1")
	testenv.WaitFor(t, 20*time.Second, "charge 1 run and committed", func() bool {
		return ranOf("charge 1") == 1 && lag(t, producer, "billing", "orders") == 0
	})
	// Idle in its poll now: a member joins the group for another topic;
	// the eager rebalance revokes orders-0 and gives it back.
	other, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("other"), kgo.DisableAutoCommit(), kgo.Balancers(kgo.RangeBalancer()))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	go other.PollFetches(ctx)
	testenv.WaitFor(t, 20*time.Second, "orders-0 revoked", func() bool { return revoked.Load() > 0 })
	produce("charge 2")
	testenv.WaitFor(t, 30*time.Second, "a record after charge 2 run", func() bool {
		if ranOf("charge 3") > 0 {
			return true
		}
		produce("charge 3") // until one comes in a poll after charge 2's
		return false
	})
	testenv.WaitFor(t, 20*time.Second, "everything committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	if n := ranOf("charge 2"); n != 1 {
		t.Fatalf("charge 2 ran %d times, everything committed: want once", n)
	}
}
