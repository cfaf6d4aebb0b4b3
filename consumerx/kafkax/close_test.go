package kafkax

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Run that returned leaves the client free to close: a client made with
// kgo.BlockRebalanceOnPoll, which Run's last poll blocked, closes with a
// plain Close (it used to hang there until CloseAllowingRebalance).
func TestClientClosesAfterRun(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("charge 1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := groupClient(t, addrs, "billing", "orders")
	ran := make(chan struct{}, 1)
	c, err := New(cl, g, func(context.Context, consumerx.Message) error {
		select {
		case ran <- struct{}{}:
		default:
		}
		return nil
	}, Options{Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	select {
	case <-ran:
	case <-time.After(20 * time.Second):
		t.Fatal("the record was not handled")
	}
	testenv.WaitFor(t, 20*time.Second, "the record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		cl.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		cl.AllowRebalance() // let the test end
		<-closed
		t.Fatal("Close hung after Run returned: the rebalance its last poll blocked was never allowed")
	}
}

// A client closed while Run retries a record in place (a record failing
// with no attempt limit) stops Run, as Run promises: the record is left
// uncommitted and unacknowledged for the group's next member, and its
// claim is not left pending. (Run went on retrying the record on the
// closed client for ever, and never returned.)
func TestCloseMidRetryStopsRun(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("charge 1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl := groupClient(t, addrs, "billing", "orders")
	failed := make(chan struct{}, 1)
	var key guard.Key
	var c *Consumer
	c, err := New(cl, g, func(ctx context.Context, msg consumerx.Message) error {
		key, _ = c.Processor().Key(msg)
		select {
		case failed <- struct{}{}:
		default:
		}
		return errors.New("card processor down")
	}, Options{RetryDelay: 20 * time.Millisecond, Process: consumerx.Options{MaxAttempts: -1, Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }() // never cancelled: only Close stops it
	select {
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Fatal("the record was not handled")
	}
	cl.CloseAllowingRebalance()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the client was closed")
	}
	// Closed during the first attempt, the claim is released and the record
	// gone; closed between attempts, the record keeps the failed attempts.
	// Either way nothing holds it.
	if key.ID == "" {
		t.Fatal("the handler saw no key")
	}
	rec, err := g.Get(ctx, key)
	if errors.Is(err, guard.ErrNotFound) {
		return
	}
	if err != nil || rec.State == guard.StatePending {
		t.Errorf("record after Run returned: %+v, %v; want no record or one not pending", rec, err)
	}
}
