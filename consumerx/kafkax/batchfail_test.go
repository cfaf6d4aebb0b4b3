package kafkax

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// One poll of 8 records on 4 partitions (produced in one request, two a
// partition, so that the poll holds them all and its partitions run at
// once): one handler fails, one always panics, one outlives its lease
// (it waits for its context, which MaxRun ends), one runs one and a half
// leases (its lease kept alive); the others succeed. Every other record
// runs exactly once, on its first attempt (a record skipped behind one
// that stopped its partition was released, no attempt counted); the
// failed one is retried in place and succeeds on attempt 2; the panicked
// one is a failed attempt each time and is dead-lettered once its 2
// attempts are spent (guard.ErrExhausted and guard.ErrPanicked), then
// acknowledged; the cut-off one is not completed by its first holder
// (Failed with guard.ErrMaxRun) and runs again on attempt 2; at the end
// every offset is committed.
func TestBatchFailPanicLongLease(t *testing.T) {
	const lease = time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{Lease: lease, MaxRun: 2 * lease})
	_, addrs, producer, stopKafka := startKafkaCluster(t, 4, "orders")
	// Partition p holds records 2p and 2p+1, in that order.
	const ok0, fails, panics, ok3, stuck, ok5, long, ok7 = 0, 1, 2, 3, 4, 5, 6, 7
	pp := partitionProducer(t, addrs)
	var recs []*kgo.Record
	for i := range 8 {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: int32(i / 2), Value: fmt.Appendf(nil, "charge %d", i),
			Headers: []kgo.RecordHeader{{Key: "n", Value: []byte(strconv.Itoa(i))}}})
	}
	produceTogether(t, pp, recs...)

	var (
		mu       sync.Mutex
		attempts = map[int][]int{}
		effects  [8]int
		outcomes = map[int][]consumerx.Outcome{}
		errs     = map[int][]error{}
		dead     = map[int][]error{}
		onePoll  bool // when MaxRun cut the stuck run, the other partitions' records had run
	)
	num := func(msg consumerx.Message) int {
		i, err := strconv.Atoi(msg.Metadata["n"])
		if err != nil {
			t.Errorf("record %s without its number", msg.ID)
		}
		return i
	}
	h := func(ctx context.Context, msg consumerx.Message) error {
		i := num(msg)
		l, _ := consumerx.LeaseFrom(ctx)
		mu.Lock()
		attempts[i] = append(attempts[i], l.Attempt)
		first := len(attempts[i]) == 1
		mu.Unlock()
		switch {
		case i == panics:
			panic("nil map")
		case i == fails && first:
			return errors.New("gateway timeout")
		case i == stuck && first:
			<-ctx.Done() // it outlives its lease: MaxRun cuts it off
			mu.Lock()
			// A poll ends when all its partitions are done: records of
			// other partitions run before this one returns were in its
			// poll (7, behind the long one, may come late on a loaded
			// machine).
			onePoll = len(attempts[ok0]) > 0 && len(attempts[fails]) > 0 && len(attempts[panics]) > 0 && len(attempts[ok3]) > 0 && len(attempts[long]) > 0
			mu.Unlock()
			return context.Cause(ctx)
		case i == long && first:
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(lease + lease/2):
			}
		}
		mu.Lock()
		effects[i]++
		mu.Unlock()
		return nil
	}
	popts := consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: 2,
		DeadLetter: func(_ context.Context, msg consumerx.Message, cause error) error {
			mu.Lock()
			defer mu.Unlock()
			dead[num(msg)] = append(dead[num(msg)], cause)
			return nil
		},
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[num(msg)] = append(outcomes[num(msg)], o)
			errs[num(msg)] = append(errs[num(msg)], err)
		}}
	cl := groupClient(t, addrs, "billing", "orders")
	c, err := New(cl, g, h, Options{RetryDelay: 20 * time.Millisecond, Process: popts})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 30*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	cl.CloseAllowingRebalance()
	stopKafka()

	mu.Lock()
	defer mu.Unlock()
	if !onePoll {
		t.Error("the records did not come in one poll: when the stuck one was cut off, records of the other partitions had not run")
	}
	for i := range 8 {
		wantEffects, wantAttempts, last := 1, "[1]", consumerx.Processed
		switch i {
		case fails, stuck:
			wantAttempts = "[1 2]"
		case panics:
			wantEffects, wantAttempts, last = 0, "[1 2]", consumerx.DeadLettered
		}
		if effects[i] != wantEffects {
			t.Errorf("record %d: %d effects, want %d", i, effects[i], wantEffects)
		}
		if got := fmt.Sprint(attempts[i]); got != wantAttempts {
			t.Errorf("record %d ran on attempts %s, want %s", i, got, wantAttempts)
		}
		// Acknowledged once, by its last delivery; before it, nothing
		// acknowledged it.
		outs := outcomes[i]
		for k, o := range outs {
			if o.Ack() != (k == len(outs)-1) || o == consumerx.Interrupted {
				t.Errorf("record %d: outcomes %v; want it acknowledged by its last only", i, outs)
				break
			}
		}
		if len(outs) == 0 || outs[len(outs)-1] != last {
			t.Errorf("record %d: outcomes %v; want the last %s", i, outs, last)
		}
	}
	if outs := outcomes[fails]; len(outs) == 0 || outs[0] != consumerx.Failed {
		t.Errorf("the failed record: outcomes %v; want Failed first", outs)
	}
	if outs, e := outcomes[stuck], errs[stuck]; len(outs) == 0 || outs[0] != consumerx.Failed || !errors.Is(e[0], guard.ErrMaxRun) {
		t.Errorf("the cut-off record: outcomes %v, errors %v; want Failed first, with guard.ErrMaxRun", outs, e)
	}
	var pe *guard.PanicError
	if outs, e := outcomes[panics], errs[panics]; len(outs) == 0 || outs[0] != consumerx.Failed || !errors.As(e[0], &pe) || pe.Value != "nil map" {
		t.Errorf("the panicking record: outcomes %v, errors %v; want Failed first, with the panic", outs, e)
	}
	if d := dead[panics]; len(d) != 1 || !errors.Is(d[0], guard.ErrExhausted) || !errors.Is(d[0], guard.ErrPanicked) {
		t.Errorf("the panicking record's dead letters: %v; want one, exhausted by the panic", d)
	}
	if len(dead) != 1 {
		t.Errorf("dead letters %v; want the panicking record's alone", dead)
	}
}
