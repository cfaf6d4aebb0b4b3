package kafkax

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
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

// A record without a usable key behind a record that fails and is
// retried in place is dead-lettered once, after the record before it
// succeeded: not once per retry of the partition.
func TestBadKeyBehindRetriedRecordDeadLetteredOnce(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	// One record key, so one partition: the good record, then the bad one.
	for _, r := range []*kgo.Record{
		{Topic: "orders", Key: []byte("customer-1"), Value: []byte("charge 1"), Headers: []kgo.RecordHeader{{Key: "order", Value: []byte("order-1")}}},
		{Topic: "orders", Key: []byte("customer-1"), Value: []byte("charge ?")},
	} {
		if err := producer.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var runs, dead atomic.Int32
	var order []string // what happened, in order: the partition's goroutine only
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		if n := runs.Add(1); n < 3 {
			order = append(order, "fail")
			return fmt.Errorf("gateway timeout #%d", n)
		}
		order = append(order, "ok")
		return nil
	}, Options{RetryDelay: 5 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t),
		Key: func(msg consumerx.Message) (string, error) {
			if id := msg.Metadata["order"]; id != "" {
				return id, nil
			}
			return "", errors.New("no order header")
		},
		DeadLetter: func(context.Context, consumerx.Message, error) error {
			dead.Add(1)
			order = append(order, "dead")
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "both records committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 3 || dead.Load() != 1 || fmt.Sprint(order) != "[fail fail ok dead]" {
		t.Errorf("handler ran %d times, dead letter called %d times; in order: %v; want [fail fail ok dead]", runs.Load(), dead.Load(), order)
	}
}

// A record whose claim another consumer holds (a member that had the
// partition before a rebalance, still running it) holds its partition:
// the records after it do not run, however often the partition is tried
// again, until that holder completes it; then they run, in offset order,
// once each, and the record itself is a duplicate, not run again.
func TestRecordHeldElsewhereHoldsItsPartition(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	other := guard.New(g.Store(), guard.Options{Lease: time.Minute})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	var recs []*kgo.Record
	for i := range 3 { // one record key, so one partition
		recs = append(recs, &kgo.Record{Topic: "orders", Key: []byte("customer-1"), Value: fmt.Appendf(nil, "charge %d", i)})
	}
	if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var (
		mu      sync.Mutex
		ran     []string
		heldFor atomic.Int32 // deliveries of the held record told it is in progress
	)
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, string(msg.Payload))
		return nil
	}, Options{RetryDelay: 10 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t),
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
			if o == consumerx.InProgress && msg.ID == ID(recs[0]) {
				heldFor.Add(1)
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	// The other consumer holds the first record.
	key, err := c.Processor().Key(message(recs[0]))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(recs[0].Value) // the default fingerprint
	held, err := other.Claim(ctx, key, base64.RawURLEncoding.EncodeToString(sum[:]))
	if err != nil || held.Status != guard.Acquired {
		t.Fatalf("other consumer's claim: %+v, %v", held, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "the held record tried three times", func() bool { return heldFor.Load() >= 3 })
	mu.Lock()
	if len(ran) != 0 {
		t.Errorf("while the first record was held elsewhere, %v ran", ran)
	}
	mu.Unlock()
	if err := other.Complete(ctx, held.Lease, nil); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 20*time.Second, "the records committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(ran) != "[charge 1 charge 2]" {
		t.Errorf("ran %q; want the two records after the held one, in order, once each", ran)
	}
}
