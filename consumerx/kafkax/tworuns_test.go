package kafkax

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Two Runs polling one client (a second Consumer of it, or Run called
// twice) would split a partition's records between them: one poll holds
// "poison" (offset 0, retried in place), the other takes the records after
// it, runs them and commits past the poison, which never ran (a member
// that then stops leaves it behind for good). The second Run is refused
// with ErrRunning, and nothing is committed past the poison.
func TestSecondRunOnOneClientRefused(t *testing.T) {
	for _, second := range []string{"another Consumer", "the same Consumer"} {
		t.Run(second, func(t *testing.T) { secondRun(t, second == "the same Consumer") })
	}
}

func secondRun(t *testing.T, same bool) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	_, addrs, producer, stopKafka := startKafkaCluster(t, 1, "orders")
	defer stopKafka()
	ctx := context.Background()
	recs := []*kgo.Record{{Topic: "orders", Value: []byte("poison")}}
	for i := range 9 {
		recs = append(recs, &kgo.Record{Topic: "orders", Value: fmt.Appendf(nil, "ok%d", i)})
	}
	if err := producer.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.Close()
	var (
		mu      sync.Mutex
		effects = map[string]int{}
		poison  = make(chan struct{})
		once    sync.Once
	)
	h := func(_ context.Context, msg consumerx.Message) error {
		if string(msg.Payload) == "poison" {
			once.Do(func() { close(poison) })
			return errors.New("card declined")
		}
		mu.Lock()
		defer mu.Unlock()
		effects[string(msg.Payload)]++
		return nil
	}
	opts := Options{MaxPollRecords: 1, RetryDelay: time.Hour, Process: consumerx.Options{MaxAttempts: -1, Logger: testenv.Logger(t)}}
	first, err := New(cl, g, h, opts)
	if err != nil {
		t.Fatal(err)
	}
	second := first
	if !same {
		if second, err = New(cl, g, h, opts); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done1, done2 := make(chan error, 1), make(chan error, 1)
	go func() { done1 <- first.Run(runCtx) }()
	<-poison // the first Run's poll holds the poison, retried in place
	go func() { done2 <- second.Run(runCtx) }()

	var err2 error
	testenv.WaitFor(t, 20*time.Second, "the second Run refused, or the group committed past the poison", func() bool {
		select {
		case err2 = <-done2:
			return true
		default:
			return lag(t, producer, "billing", "orders") == 0
		}
	})
	if !errors.Is(err2, ErrRunning) {
		mu.Lock()
		t.Errorf("second Run: %v, want ErrRunning; the group's lag is %d with the poison never run (records run %v)",
			err2, lag(t, producer, "billing", "orders"), effects)
		mu.Unlock()
	}
	if n := lag(t, producer, "billing", "orders"); n != 10 && n != -1 {
		t.Errorf("lag %d, want 10: nothing committed past the poison", n)
	}
	stop()
	if err := <-done1; err != nil {
		t.Error(err)
	}
	if err2 == nil {
		if err := <-done2; err != nil {
			t.Error(err)
		}
	}
}
