package jetstreamx

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// One fetch of 8 messages, run as one batch by Consume (Batch 8,
// Concurrency 8): one handler fails, one always panics, one outlives its
// lease (it waits for its context, which MaxRun ends), one runs one and a
// half leases (its lease kept alive); the others succeed. The batch runs
// past the consumer's AckWait, reported in progress meanwhile. Every
// other message runs exactly once and is acknowledged, never delivered
// again; the failed one is Nak'ed, delivered again and succeeds on
// attempt 2; the panicked one is a failed attempt each time and is
// dead-lettered once its 2 attempts are spent (guard.ErrExhausted and
// guard.ErrPanicked), then acknowledged; the cut-off one is not completed
// by its first holder (Failed with guard.ErrMaxRun), and runs again on
// attempt 2; at the end nothing is pending.
func TestBatchFailPanicLongLease(t *testing.T) {
	const lease = time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{Lease: lease, MaxRun: 2 * lease})
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{AckWait: lease})
	for i := range 8 {
		if _, err := js.Publish(ctx, fmt.Sprint("orders.", i), fmt.Appendf(nil, "charge %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	const fails, panics, stuck, long = 1, 3, 5, 6

	var (
		mu        sync.Mutex
		delivered = map[int][]uint64{}
		started   int  // messages that began their first run
		seconds   int  // runs after a message's first
		oneBatch  bool // when MaxRun cut the stuck run, every message had begun and none run again
	)
	b := &consumertest.FailPanicLong{Lease: lease, Fails: fails, Panics: panics, Stuck: stuck, Long: long,
		Began: func(_ int, first bool) {
			mu.Lock()
			defer mu.Unlock()
			if first {
				started++
			} else {
				seconds++
			}
		},
		StuckCut: func() {
			mu.Lock()
			defer mu.Unlock()
			oneBatch = started == 8 && seconds == 0
		}}
	num := func(msg consumerx.Message) int {
		var i int
		if _, err := fmt.Sscanf(string(msg.Payload), "charge %d", &i); err != nil {
			t.Errorf("message %s: %v", msg.ID, err)
		}
		return i
	}
	h, err := New(g, func(ctx context.Context, msg consumerx.Message) error {
		i := num(msg)
		md, _ := msg.Raw.(jetstream.Msg).Metadata()
		mu.Lock()
		delivered[i] = append(delivered[i], md.NumDelivered)
		mu.Unlock()
		return b.Run(ctx, i)
	}, Options{Group: "billing", Batch: 8, Concurrency: 8, InProgressDelay: 50 * time.Millisecond, MaxWait: 200 * time.Millisecond,
		Process: b.Process(consumerx.Options{Logger: testenv.Logger(t)}, num)})
	if err != nil {
		t.Fatal(err)
	}
	stop := consumeAll(t, h, cons, 1)
	testenv.WaitFor(t, 30*time.Second, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && b.Acked() == 8 && info.NumAckPending == 0 && info.NumPending == 0
	})
	stop()
	stopNATS()

	mu.Lock()
	defer mu.Unlock()
	if !oneBatch {
		t.Error("the 8 messages did not run in one batch: when the stuck one was cut off, not every message had begun, or one ran again")
	}
	// Each run was a delivery of its own: nothing delivered again while
	// it ran (the in-progress reports past AckWait).
	for i := range 8 {
		if got, want := fmt.Sprint(delivered[i]), b.Runs(i); got != want {
			t.Errorf("message %d ran on deliveries %s, want %s (one per attempt)", i, got, want)
		}
	}
	b.Check(t, "message")
}
