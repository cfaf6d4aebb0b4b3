package jetstreamx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// One fetch of 8 messages, run as one batch by Consume (Batch 8,
// Concurrency 8): one handler fails, one always panics, one outlives its
// lease (it waits for its context, which MaxRun ends), one runs one and a
// half leases (its lease kept alive); the others succeed. The batch runs
// past the consumer's AckWait, reported in progress meanwhile. Every
// other message runs exactly once and is acknowledged, never delivered
// again; the failed one is Nak'ed, delivered again and succeeds on
// attempt 2; the panicked one is a failed attempt each time and is
// dead-lettered once its 2 attempts are spent (guard.ErrExhausted and
// guard.ErrPanicked), then acknowledged; the cut-off one is not completed
// by its first holder (Failed with guard.ErrMaxRun), and runs again on
// attempt 2; at the end nothing is pending.
func TestBatchFailPanicLongLease(t *testing.T) {
	const lease = time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{Lease: lease, MaxRun: 2 * lease})
	js, stopNATS := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{AckWait: lease})
	for i := range 8 {
		if _, err := js.Publish(ctx, fmt.Sprint("orders.", i), fmt.Appendf(nil, "charge %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	const fails, panics, stuck, long = 1, 3, 5, 6

	var (
		mu        sync.Mutex
		attempts  = map[int][]int{}
		delivered = map[int][]uint64{}
		effects   [8]int
		outcomes  = map[int][]consumerx.Outcome{}
		errs      = map[int][]error{}
		dead      = map[int][]error{}
		started   int  // messages that began their first run
		seconds   int  // runs after a message's first
		oneBatch  bool // when MaxRun cut the stuck run, every message had begun and none run again
	)
	num := func(msg consumerx.Message) int {
		var i int
		if _, err := fmt.Sscanf(string(msg.Payload), "charge %d", &i); err != nil {
			t.Errorf("message %s: %v", msg.ID, err)
		}
		return i
	}
	h, err := New(g, func(ctx context.Context, msg consumerx.Message) error {
		i := num(msg)
		l, _ := consumerx.LeaseFrom(ctx)
		md, _ := msg.Raw.(jetstream.Msg).Metadata()
		mu.Lock()
		attempts[i] = append(attempts[i], l.Attempt)
		delivered[i] = append(delivered[i], md.NumDelivered)
		first := len(attempts[i]) == 1
		if first {
			started++
		} else {
			seconds++
		}
		mu.Unlock()
		switch {
		case i == panics:
			panic("nil map")
		case i == fails && first:
			return errors.New("gateway timeout")
		case i == stuck && first:
			<-ctx.Done() // it outlives its lease: MaxRun cuts it off
			mu.Lock()
			oneBatch = started == 8 && seconds == 0
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
	}, Options{Group: "billing", Batch: 8, Concurrency: 8, InProgressDelay: 50 * time.Millisecond, MaxWait: 200 * time.Millisecond,
		Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: 2,
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
			}}})
	if err != nil {
		t.Fatal(err)
	}
	acked := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, outs := range outcomes {
			if len(outs) > 0 && outs[len(outs)-1].Ack() {
				n++
			}
		}
		return n
	}
	stop := consumeAll(t, h, cons, 1)
	testenv.WaitFor(t, 30*time.Second, "every message acknowledged", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && acked() == 8 && info.NumAckPending == 0 && info.NumPending == 0
	})
	stop()
	stopNATS()

	mu.Lock()
	defer mu.Unlock()
	if !oneBatch {
		t.Error("the 8 messages did not run in one batch: when the stuck one was cut off, not every message had begun, or one ran again")
	}
	for i := range 8 {
		wantEffects, wantAttempts, wantDelivered, last := 1, "[1]", "[1]", consumerx.Processed
		switch i {
		case fails, stuck:
			wantAttempts, wantDelivered = "[1 2]", "[1 2]"
		case panics:
			wantEffects, wantAttempts, wantDelivered, last = 0, "[1 2]", "[1 2]", consumerx.DeadLettered
		}
		if effects[i] != wantEffects {
			t.Errorf("message %d: %d effects, want %d", i, effects[i], wantEffects)
		}
		if got := fmt.Sprint(attempts[i]); got != wantAttempts {
			t.Errorf("message %d ran on attempts %s, want %s", i, got, wantAttempts)
		}
		if got := fmt.Sprint(delivered[i]); got != wantDelivered {
			t.Errorf("message %d ran on deliveries %s, want %s", i, got, wantDelivered)
		}
		outs := outcomes[i]
		for k, o := range outs {
			if o.Ack() != (k == len(outs)-1) || o == consumerx.Interrupted {
				t.Errorf("message %d: outcomes %v; want it acknowledged by its last only", i, outs)
				break
			}
		}
		if len(outs) == 0 || outs[len(outs)-1] != last {
			t.Errorf("message %d: outcomes %v; want the last %s", i, outs, last)
		}
	}
	if outs := outcomes[fails]; len(outs) == 0 || outs[0] != consumerx.Failed {
		t.Errorf("the failed message: outcomes %v; want Failed first", outs)
	}
	if outs, e := outcomes[stuck], errs[stuck]; len(outs) == 0 || outs[0] != consumerx.Failed || !errors.Is(e[0], guard.ErrMaxRun) {
		t.Errorf("the cut-off message: outcomes %v, errors %v; want Failed first, with guard.ErrMaxRun", outs, e)
	}
	var pe *guard.PanicError
	if outs, e := outcomes[panics], errs[panics]; len(outs) == 0 || outs[0] != consumerx.Failed || !errors.As(e[0], &pe) || pe.Value != "nil map" {
		t.Errorf("the panicking message: outcomes %v, errors %v; want Failed first, with the panic", outs, e)
	}
	if d := dead[panics]; len(d) != 1 || !errors.Is(d[0], guard.ErrExhausted) || !errors.Is(d[0], guard.ErrPanicked) {
		t.Errorf("the panicking message's dead letters: %v; want one, exhausted by the panic", d)
	}
	if len(dead) != 1 {
		t.Errorf("dead letters %v; want the panicking message's alone", dead)
	}
}
