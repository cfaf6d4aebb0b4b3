package kafkax

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A Run stopped while a handler runs "charge 1" (the handler heeds its
// context: Interrupted, its claim released, nothing committed), then Run
// again on the same client, one after the other as Run allows: the second
// Run must fetch "charge 1" again and run it, not fetch on from where the
// first Run's poll ended and commit "charge 2" past it.
func TestRunAgainAfterStopRunsUnfinishedRecords(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	_, addrs, producer, _ := startKafkaCluster(t, 1, "orders")
	ctx := context.Background()
	produce := func(v string) {
		t.Helper()
		if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce("charge 1")
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var (
		mu      sync.Mutex
		ran     = map[string]int{}
		holding = true // the first Run's "charge 1" waits for its end
	)
	started := make(chan struct{}, 1)
	c, err := New(cl, g, func(ctx context.Context, msg consumerx.Message) error {
		mu.Lock()
		hold := holding && string(msg.Payload) == "charge 1"
		mu.Unlock()
		if hold {
			started <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}
		mu.Lock()
		ran[string(msg.Payload)]++
		mu.Unlock()
		return nil
	}, Options{RetryDelay: 10 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	first, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(first) }()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("charge 1 did not start")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	holding = false
	mu.Unlock()
	produce("charge 2")

	second, stop := context.WithCancel(ctx)
	go func() { done <- c.Run(second) }()
	testenv.WaitFor(t, 20*time.Second, "charge 2 run and the group's lag 0", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ran["charge 2"] > 0 && lag(t, producer, "billing", "orders") == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran["charge 1"] != 1 || ran["charge 2"] != 1 {
		t.Errorf("effects: charge 1 %d, charge 2 %d, want 1 each: the second Run committed past a record the first left unfinished",
			ran["charge 1"], ran["charge 2"])
	}
}
