package kafkax

import (
	"context"
	"fmt"
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

// A second member joins while the first's handlers still run the first
// record of every partition, on clients that do not block rebalances
// (no kgo.BlockRebalanceOnPoll): partitions are revoked from the first
// member mid-poll and given to the second, which fetches them from the
// last commit. The first's client has kgo's OnPartitionsRevoked, not
// kafkax's: its handlers are not told (revoke_test.go tests kafkax's
// callbacks). The second finds the records the first claimed in
// progress and waits; the first finishes them and commits its poll for
// partitions it no longer owns (franz-go sends it). No record runs
// twice or at once in both, none is left unrun, and the group ends with
// everything committed.
func TestRebalanceMidPollRunsEachRecordOnce(t *testing.T) {
	const n = 30
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	manual := partitionProducer(t, addrs)
	ctx := context.Background()
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: int32(i % 3), Value: fmt.Appendf(nil, "charge %d", i)})
	}
	var (
		mu       sync.Mutex
		effects  = map[string]int{}
		running  = map[string]int{}
		overlap  []string
		heldOnce = map[int32]bool{} // partition → its first record held
		held     atomic.Int32
		release  = make(chan struct{})
		revoked  atomic.Int32
		assigned atomic.Int32
		assignA  atomic.Int32
		inProgB  atomic.Int32
	)
	handler := func(member string) consumerx.Handler {
		return func(ctx context.Context, msg consumerx.Message) error {
			r := msg.Raw.(*kgo.Record)
			mu.Lock()
			running[msg.ID]++
			if running[msg.ID] > 1 {
				overlap = append(overlap, msg.ID)
			}
			hold := member == "A" && string(r.Value) != "warm" && !heldOnce[r.Partition]
			if hold {
				heldOnce[r.Partition] = true
			}
			mu.Unlock()
			if hold {
				held.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			mu.Lock()
			running[msg.ID]--
			effects[msg.ID]++
			mu.Unlock()
			return nil
		}
	}
	client := func(opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
			kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.FetchMaxWait(100 * time.Millisecond),
			kgo.FetchMinBytes(1 << 20), // a fetch waits its MaxWait: it takes every partition's records
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	clA := client(kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		revoked.Add(int32(len(m["orders"])))
	}), kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		assignA.Add(int32(len(m["orders"])))
	}))
	defer clA.Close()
	popts := consumerx.Options{Logger: testenv.Logger(t)}
	a, err := New(clA, g, handler("A"), Options{Process: popts, RetryDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	members := 1
	go func() { done <- a.Run(runCtx) }()
	var releaseOnce sync.Once
	defer func() {
		releaseOnce.Do(func() { close(release) })
		stop()
		for range members {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	// Produced once A fetches every partition (a record of each warms it
	// up), so that its next poll takes them all.
	testenv.WaitFor(t, 20*time.Second, "A assigned every partition", func() bool { return assignA.Load() == 3 })
	for p := range int32(3) {
		produceTogether(t, manual, &kgo.Record{Topic: "orders", Partition: p, Value: []byte("warm")})
	}
	testenv.WaitFor(t, 20*time.Second, "the warm-up records committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	produceTogether(t, manual, recs...) // in one request: A's one poll has every partition
	testenv.WaitFor(t, 20*time.Second, "A holding the first record of each partition", func() bool { return held.Load() == 3 })
	bopts := popts
	bopts.OnOutcome = func(_ context.Context, _ consumerx.Message, o consumerx.Outcome, _ error) {
		if o == consumerx.InProgress {
			inProgB.Add(1)
		}
	}
	// B joins the group when its client is made: once A holds its records.
	clB := client(kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		assigned.Add(int32(len(m["orders"])))
	}))
	defer clB.Close()
	b, err := New(clB, g, handler("B"), Options{Process: bopts, RetryDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	members++
	go func() { done <- b.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "partitions moved to B, and B finding A's records in progress", func() bool {
		return revoked.Load() > 0 && assigned.Load() > 0 && inProgB.Load() > 0
	})
	t.Logf("A holds %d records; %d partitions revoked from A, %d assigned to B; B found A's records in progress %d times",
		held.Load(), revoked.Load(), assigned.Load(), inProgB.Load())
	releaseOnce.Do(func() { close(release) })
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("records run at once by both members: %v", overlap)
	}
	for _, r := range recs {
		if got := effects[ID(r)]; got != 1 {
			t.Errorf("%s (%s) ran %d times, want 1", ID(r), r.Value, got)
		}
	}
}
