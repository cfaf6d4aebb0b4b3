package kafkax

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The member falls out of the group (its heartbeat answered
// UNKNOWN_MEMBER_ID: franz-go calls OnPartitionsLost) while a handler
// waits on its context: the handler's context ends with ErrRevoked and
// the record is Interrupted, its claim released; the member's own lost
// callback is called behind kafkax's. The member then joins again and the
// record runs once.
func TestLostPartitionsHandlerInterrupted(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	cluster, addrs, producer, stopKafka := startKafkaCluster(t, 1, "orders")
	defer stopKafka()
	var (
		mu      sync.Mutex
		runs    int
		effects int
		out     []consumerx.Outcome
		outErr  []error
		lost    atomic.Int32
		held    = make(chan struct{}, 1)
		release = make(chan struct{})
	)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		OnPartitionsRevoked(nil), OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) { lost.Add(1) }))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := New(cl, g, func(ctx context.Context, msg consumerx.Message) error {
		mu.Lock()
		runs++
		first := runs == 1
		mu.Unlock()
		if first {
			held <- struct{}{}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-release:
			}
		}
		mu.Lock()
		effects++
		mu.Unlock()
		return nil
	}, Options{RetryDelay: 20 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t),
		OnOutcome: func(_ context.Context, _ consumerx.Message, o consumerx.Outcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			out, outErr = append(out, o), append(outErr, err)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		close(release)
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("charge")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	<-held
	// The next heartbeat is answered: this member is unknown.
	cluster.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	testenv.WaitFor(t, 20*time.Second, "the held record Interrupted once the member lost its partition", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(out) > 0
	})
	mu.Lock()
	if out[0] != consumerx.Interrupted || !errors.Is(outErr[0], ErrRevoked) {
		t.Errorf("first outcome %v (%v); want Interrupted matching ErrRevoked", out[0], outErr[0])
	}
	mu.Unlock()
	// The member's own callback runs behind kafkax's, which interrupted
	// the handler: it may not have run yet.
	testenv.WaitFor(t, 20*time.Second, "the member's own lost callback called", func() bool { return lost.Load() > 0 })
	testenv.WaitFor(t, 60*time.Second, "the record run again once the member joined again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return effects == 1
	})
}
