package kafkax

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// One poll of 8 records on 4 partitions (produced in one request, two a
// partition, so that the poll holds them all and its partitions run at
// once): one handler fails, one always panics, one outlives its lease
// (it waits for its context, which MaxRun ends), one runs one and a half
// leases (its lease kept alive); the others succeed. Every other record
// runs exactly once, on its first attempt (a record skipped behind one
// that stopped its partition was released, no attempt counted); the
// failed one is retried in place and succeeds on attempt 2; the panicked
// one is a failed attempt each time and is dead-lettered once its 2
// attempts are spent (guard.ErrExhausted and guard.ErrPanicked), then
// acknowledged; the cut-off one is not completed by its first holder
// (Failed with guard.ErrMaxRun) and runs again on attempt 2; at the end
// every offset is committed.
func TestBatchFailPanicLongLease(t *testing.T) {
	const lease = time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{Lease: lease, MaxRun: 2 * lease})
	_, addrs, producer, stopKafka := startKafkaCluster(t, 4, "orders")
	// Partition p holds records 2p and 2p+1, in that order.
	const ok0, fails, panics, ok3, stuck, ok5, long, ok7 = 0, 1, 2, 3, 4, 5, 6, 7
	pp := partitionProducer(t, addrs)
	var recs []*kgo.Record
	for i := range 8 {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: int32(i / 2), Value: fmt.Appendf(nil, "charge %d", i),
			Headers: []kgo.RecordHeader{{Key: "n", Value: []byte(strconv.Itoa(i))}}})
	}
	produceTogether(t, pp, recs...)

	var onePoll atomic.Bool // when MaxRun cut the stuck run, the other partitions' records had run
	b := &consumertest.FailPanicLong{Lease: lease, Fails: fails, Panics: panics, Stuck: stuck, Long: long}
	// A poll ends when all its partitions are done: records of other
	// partitions run before the stuck one returns were in its poll (7,
	// behind the long one, may come late on a loaded machine).
	b.StuckCut = func() { onePoll.Store(b.Ran(ok0, fails, panics, ok3, long)) }
	num := func(msg consumerx.Message) int {
		i, err := strconv.Atoi(msg.Metadata["n"])
		if err != nil {
			t.Errorf("record %s without its number", msg.ID)
		}
		return i
	}
	h := func(ctx context.Context, msg consumerx.Message) error { return b.Run(ctx, num(msg)) }
	popts := b.Process(consumerx.Options{Logger: testenv.Logger(t)}, num)
	cl := groupClient(t, addrs, "billing", "orders")
	c, err := New(cl, g, h, Options{RetryDelay: 20 * time.Millisecond, Process: popts})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cl.CloseAllowingRebalance()
	stopKafka()

	if !onePoll.Load() {
		t.Error("the records did not come in one poll: when the stuck one was cut off, records of the other partitions had not run")
	}
	b.Check(t, "record")
}
