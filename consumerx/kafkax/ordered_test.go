package kafkax

import (
	"context"
	"errors"
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
