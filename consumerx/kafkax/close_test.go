package kafkax

import (
	"context"
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
