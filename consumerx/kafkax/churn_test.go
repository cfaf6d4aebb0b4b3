package kafkax

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Members join and leave a group while its records run (clients with
// kafkax's revocation callbacks, without kgo.BlockRebalanceOnPoll, so
// partitions are taken mid-poll), under handlers that ignore their
// context and fail a record's first run now and then. No record's effect
// runs twice or in two members at once, each record's attempts are
// counted once each (the run that succeeds is attempt 1 + the failures
// reported Failed; a failure after a revocation is Interrupted and not
// counted), nothing is dead-lettered, and the group ends with every
// record committed.
func TestMemberChurnEffectsOnce(t *testing.T) {
	const n, churns = 150, 4
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	manual := partitionProducer(t, addrs)
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: int32(i % 3), Value: fmt.Appendf(nil, "charge %d", i)})
	}
	var (
		mu       sync.Mutex
		effects  = map[string]int{}
		running  = map[string]int{}
		overlap  []string
		runs     = map[string]int{} // handler runs
		failed   = map[string]int{} // deliveries reported Failed
		attempt  = map[string]int{} // the attempt of the run that succeeded
		dead     int
		progress int
		outcomes = map[consumerx.Outcome]int{}
	)
	handler := func(ctx context.Context, msg consumerx.Message) error {
		lease, _ := consumerx.LeaseFrom(ctx)
		mu.Lock()
		running[msg.ID]++
		if running[msg.ID] > 1 {
			overlap = append(overlap, msg.ID)
		}
		runs[msg.ID]++
		fail := runs[msg.ID] == 1 && rand.IntN(7) == 0
		mu.Unlock()
		// The effect takes a while, whatever its context says.
		<-time.After(time.Duration(rand.IntN(4)) * time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		running[msg.ID]--
		if fail {
			return errors.New("gateway timeout")
		}
		effects[msg.ID]++
		attempt[msg.ID] = lease.Attempt
		progress++
		return nil
	}
	popts := consumerx.Options{Logger: testenv.LoggerAt(t, slog.LevelError), MaxAttempts: 5,
		DeadLetter: func(context.Context, consumerx.Message, error) error {
			mu.Lock()
			defer mu.Unlock()
			dead++
			return nil
		},
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[o]++
			if o == consumerx.Failed {
				failed[msg.ID]++
			}
		}}
	type member struct {
		stop context.CancelFunc
		done chan error
		cl   *kgo.Client
	}
	join := func() *member {
		cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumerGroup("billing"),
			kgo.ConsumeTopics("orders"), kgo.DisableAutoCommit(), kgo.FetchMaxWait(100*time.Millisecond),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), OnPartitionsRevoked(nil), OnPartitionsLost(nil))
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(cl, g, handler, Options{Process: popts, RetryDelay: 5 * time.Millisecond, MaxPollRecords: 10})
		if err != nil {
			cl.Close()
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		m := &member{stop: stop, done: make(chan error, 1), cl: cl}
		go func() { m.done <- c.Run(ctx) }()
		return m
	}
	leave := func(m *member) {
		m.stop()
		if err := <-m.done; err != nil {
			t.Errorf("Run: %v", err)
		}
		m.cl.Close()
	}
	members := []*member{join(), join()}
	defer func() {
		for _, m := range members {
			leave(m)
		}
	}()
	produceTogether(t, manual, recs...)
	for c := range churns {
		testenv.WaitFor(t, 30*time.Second, fmt.Sprintf("%d records done", (c+1)*n/(churns+2)), func() bool {
			mu.Lock()
			defer mu.Unlock()
			return progress >= (c+1)*n/(churns+2)
		})
		leave(members[0])
		members = append(members[1:], join())
	}
	testenv.WaitFor(t, 60*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	mu.Lock()
	defer mu.Unlock()
	if len(overlap) > 0 {
		t.Errorf("records run at once in two members: %v", overlap)
	}
	if dead > 0 {
		t.Errorf("%d dead letters, want none", dead)
	}
	retried := 0
	for _, r := range recs {
		id := ID(r)
		if effects[id] != 1 {
			t.Errorf("%s: %d effects, want 1", id, effects[id])
		}
		if attempt[id] != failed[id]+1 {
			t.Errorf("%s succeeded at attempt %d after %d failures reported", id, attempt[id], failed[id])
		}
		if runs[id] > 1 {
			retried++
		}
	}
	t.Logf("%d records, %d run more than once (failed first), %d member changes; deliveries by outcome %v", n, retried, churns, outcomes)
}
