package kafkax

import (
	"context"
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

// TestLostPartitionRecordsPolledDuringCallbackStopped: OnPartitionsLost
// promises that lost partitions "are stopped as OnPartitionsRevoked stops
// revoked ones". franz-go (cooperative, the default balancer; no
// BlockRebalanceOnPoll) calls onLost before it stops fetching the lost
// partitions (manageFailWait invalidates the assignment only after the
// callback returns). kafkax marked the partitions revoked at the start of
// its callback, then called the member's; a poll that Run began after that
// mark and that returned the lost partition's records (still fetched) was
// not seen as revoked (tracker.add compares the revocation with the poll's
// mark): the record ran under a live context, never ended with ErrRevoked,
// by a member that had lost it. The partitions count as revoked now until
// the callback returns.
func TestLostPartitionRecordsPolledDuringCallbackStopped(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	cluster, addrs, producer, stopKafka := startKafkaCluster(t, 1, "orders")
	defer stopKafka()
	var (
		lostOnce sync.Once
		lost     = make(chan struct{})
		verdict  = make(chan string, 1)
		aDone    = make(chan struct{}, 1)
		// inCallback: the member's lost callback runs; franz-go has not
		// stopped fetching the lost partition, nor given it back.
		inCallback atomic.Bool
		// bPolledInCallback: a poll returned b while the callback ran, the
		// window this test is about.
		bPolledInCallback atomic.Bool
	)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
		kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.WithHooks(polledHook(func(r *kgo.Record) {
			if string(r.Value) == "b" && inCallback.Load() {
				bPolledInCallback.Store(true)
			}
		})),
		OnPartitionsRevoked(nil), OnPartitionsLost(func(context.Context, *kgo.Client, map[string][]int32) {
			inCallback.Store(true)
			defer inCallback.Store(false)
			lostOnce.Do(func() { close(lost) })
			// The member's own callback takes a moment (a flush, a log).
			time.Sleep(3 * time.Second)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	c, err := New(cl, g, func(ctx context.Context, msg consumerx.Message) error {
		switch string(msg.Payload) {
		case "a":
			aDone <- struct{}{}
		case "b":
			switch {
			case !inCallback.Load():
				verdict <- "ran once the member had its partition again"
			case ctx.Err() == nil:
				verdict <- "ran under a live context after the member lost the partition"
			default:
				verdict <- "stopped: " + context.Cause(ctx).Error()
			}
			return ctx.Err()
		}
		return nil
	}, Options{RetryDelay: 20 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("a")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-aDone:
	case <-time.After(20 * time.Second):
		t.Fatal("a not handled")
	}
	cluster.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		resp := req.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil, true
	})
	select {
	case <-lost:
	case <-time.After(20 * time.Second):
		t.Fatal("the member did not lose its partition")
	}
	if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Value: []byte("b")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-verdict:
		if v == "ran under a live context after the member lost the partition" {
			t.Fatalf("record b of the lost partition %s (not ended with ErrRevoked)", v)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("b not handled within 30s")
	}
	if !bPolledInCallback.Load() {
		t.Fatal("no poll returned b while the lost callback ran: the window was not exercised")
	}
}

// polledHook calls f with each record a poll returns.
type polledHook func(*kgo.Record)

func (h polledHook) OnFetchRecordUnbuffered(r *kgo.Record, polled bool) {
	if polled {
		h(r)
	}
}
