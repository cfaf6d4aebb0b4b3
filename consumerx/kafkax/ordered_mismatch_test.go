package kafkax

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A record whose key was used before with another payload (a mismatch:
// dead-lettered), behind a record that fails and is retried in place, is
// dead-lettered once the record before it succeeded, as a record without
// a usable key is: the partition's order holds for its dead letters too.
// (It used to be dead-lettered in the partition's first batch, while the
// record before it had yet to run.)
func TestReusedKeyBehindRetriedRecordDeadLetteredInOrder(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	header := func(id string) []kgo.RecordHeader { return []kgo.RecordHeader{{Key: "order", Value: []byte(id)}} }
	// One record key, so one partition: the record that fails twice, then
	// order-2 again with another payload.
	for _, r := range []*kgo.Record{
		{Topic: "orders", Key: []byte("customer-1"), Value: []byte("charge 1"), Headers: header("order-1")},
		{Topic: "orders", Key: []byte("customer-1"), Value: []byte("charge 2, changed"), Headers: header("order-2")},
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
		Key: func(msg consumerx.Message) (string, error) { return msg.Metadata["order"], nil },
		DeadLetter: func(context.Context, consumerx.Message, error) error {
			dead.Add(1)
			order = append(order, "dead")
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	// order-2 ran before, with its first payload.
	if o, err := c.Processor().Process(ctx, consumerx.Message{ID: "earlier", Payload: []byte("charge 2"), Metadata: map[string]string{"order": "order-2"}},
		func(context.Context, consumerx.Message) error { return nil }); o != consumerx.Processed {
		t.Fatalf("order-2's first run: %s, %v", o, err)
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
