package kafkax

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A handler that calls runtime.Goexit ends its partition's goroutine in
// the middle of a batch. The record is not acknowledged (the guard
// released its claim), so neither it nor the records behind it may be
// committed unrun: the partition is taken up again from that record, in
// order, and the poll is committed once every record is acknowledged. A
// record dead-lettered before it is not dead-lettered again.
func TestGoexitRecordRetriedInPlace(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	// One record key, so one partition; one produce, so one poll.
	var recs []*kgo.Record
	for _, v := range []string{"charge 1", "bad", "exit", "charge 3"} {
		recs = append(recs, &kgo.Record{Topic: "orders", Key: []byte("customer-1"), Value: []byte(v)})
	}
	if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var (
		mu     sync.Mutex
		order  []string
		exited bool
	)
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		mu.Lock()
		order = append(order, string(msg.Payload))
		exit := string(msg.Payload) == "exit" && !exited
		exited = exited || exit
		mu.Unlock()
		if exit {
			runtime.Goexit()
		}
		return nil
	}, Options{RetryDelay: 5 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t),
		Key: func(msg consumerx.Message) (string, error) {
			if string(msg.Payload) == "bad" {
				return "", errors.New("no usable key")
			}
			return msg.ID, nil
		},
		DeadLetter: func(context.Context, consumerx.Message, error) error {
			mu.Lock()
			order = append(order, "dead")
			mu.Unlock()
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[charge 1 dead exit exit charge 3]" {
		t.Errorf("handled in order: %q; want [charge 1 dead exit exit charge 3]", order)
	}
}

// A record whose handler always calls runtime.Goexit holds back its
// partition (no attempt is counted) until the consumer stops: Run then
// returns at once, though the partition waits RetryDelay to take it up
// again, and neither it nor the record behind it is committed.
func TestGoexitRecordHoldsPartitionUntilStop(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	var recs []*kgo.Record
	for _, v := range []string{"charge 1", "exit", "charge 3"} {
		recs = append(recs, &kgo.Record{Topic: "orders", Key: []byte("customer-1"), Value: []byte(v)})
	}
	if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	exits := make(chan struct{}, 10)
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		if string(msg.Payload) == "exit" {
			exits <- struct{}{}
			runtime.Goexit()
		}
		return nil
	}, Options{RetryDelay: time.Hour, Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-exits:
	case <-time.After(20 * time.Second):
		t.Fatal("the record never ran")
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := lag(t, producer, "billing", "orders"); n != 3 {
		t.Errorf("lag %d after the stop; want 3: nothing committed", n)
	}
}
