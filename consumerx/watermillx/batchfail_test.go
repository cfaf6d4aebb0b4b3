package watermillx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// 8 messages delivered at once to 8 handlers of one group competing for
// a queue (each first run waits until all 8 have begun, so each handler
// holds one): one handler fails, one always panics, one outlives its
// lease (it waits for its context, which MaxRun ends), one runs one and
// a half leases (its lease kept alive); the others succeed. Every other
// message runs exactly once and is acknowledged on its one delivery; the
// failed one is nacked, delivered again and succeeds on attempt 2; the
// panicked one is a failed attempt each time (nacked with
// guard.ErrPanicked) and is dead-lettered once its 2 attempts are spent
// (guard.ErrExhausted and guard.ErrPanicked), then acknowledged; the
// cut-off one is not completed by its first holder (nacked, Failed with
// guard.ErrMaxRun), and runs again on attempt 2; at the end nothing is
// left in the queue and every delivery was answered.
func TestBatchFailPanicLongLease(t *testing.T) {
	const lease = time.Second
	g, _, _ := consumertest.Guard(t, guard.Options{Lease: lease, MaxRun: 2 * lease})
	b := newBus(t)
	q := newQueue(64)
	const fails, panics, stuck, long = 1, 3, 5, 6

	var (
		mu       sync.Mutex
		attempts = map[int][]int{}
		effects  [8]int
		outcomes = map[int][]consumerx.Outcome{}
		errs     = map[int][]error{}
		answers  = map[int][]error{} // what the handler chain told the router, per delivery
		dead     = map[int][]error{}
		started  int
		all      = make(chan struct{}) // closed once every message began its first run
	)
	num := func(payload []byte) int {
		var i int
		if _, err := fmt.Sscanf(string(payload), "charge %d", &i); err != nil {
			t.Errorf("message %q: %v", payload, err)
		}
		return i
	}
	mw, err := New(g, Options{Group: "billing", InProgressDelay: 50 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: 2,
		DeadLetter: func(_ context.Context, msg consumerx.Message, cause error) error {
			mu.Lock()
			defer mu.Unlock()
			dead[num(msg.Payload)] = append(dead[num(msg.Payload)], cause)
			return nil
		},
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, err error) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[num(msg.Payload)] = append(outcomes[num(msg.Payload)], o)
			errs[num(msg.Payload)] = append(errs[num(msg.Payload)], err)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(msg *message.Message) error {
		ctx := msg.Context()
		i := num(msg.Payload)
		l, _ := consumerx.LeaseFrom(ctx)
		mu.Lock()
		attempts[i] = append(attempts[i], l.Attempt)
		first := len(attempts[i]) == 1
		if first {
			if started++; started == 8 {
				close(all)
			}
		}
		mu.Unlock()
		if first {
			select {
			case <-all:
			case <-time.After(10 * time.Second):
				t.Errorf("message %d: the 8 messages did not run at once", i)
			}
		}
		switch {
		case i == panics:
			panic("nil map")
		case i == fails && first:
			return errors.New("gateway timeout")
		case i == stuck && first:
			<-ctx.Done() // it outlives its lease: MaxRun cuts it off
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
	// answer records what the router is told (nil: ack), outside the
	// middleware.
	answer := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			mu.Lock()
			answers[num(msg.Payload)] = append(answers[num(msg.Payload)], err)
			mu.Unlock()
			return out, err
		}
	}
	for c := range 8 {
		b.router.AddConsumerHandler(fmt.Sprint("billing-", c), "orders", q, handle).AddMiddleware(answer, mw.Middleware)
	}
	t.Cleanup(func() { _ = q.Close() }) // after the router closed (cleanups run last first)
	for i := range 8 {
		_ = q.Publish("orders", message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, "charge %d", i)))
	}
	b.start()
	acked := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range answers {
			if len(a) > 0 && a[len(a)-1] == nil {
				n++
			}
		}
		return n
	}
	testenv.WaitFor(t, 30*time.Second, "every message acknowledged", func() bool { return acked() == 8 && len(q.in) == 0 })

	mu.Lock()
	defer mu.Unlock()
	for i := range 8 {
		wantEffects, wantAttempts, last := 1, "[1]", consumerx.Processed
		switch i {
		case fails, stuck:
			wantAttempts = "[1 2]"
		case panics:
			wantEffects, wantAttempts, last = 0, "[1 2]", consumerx.DeadLettered
		}
		if effects[i] != wantEffects {
			t.Errorf("message %d: %d effects, want %d", i, effects[i], wantEffects)
		}
		if got := fmt.Sprint(attempts[i]); got != wantAttempts {
			t.Errorf("message %d ran on attempts %s, want %s", i, got, wantAttempts)
		}
		outs, ans := outcomes[i], answers[i]
		if len(outs) != len(ans) {
			t.Errorf("message %d: outcomes %v, answers %v; want one of each a delivery", i, outs, ans)
		}
		for k, o := range outs {
			if o.Ack() != (k == len(outs)-1) || o == consumerx.Interrupted || k < len(ans) && (ans[k] == nil) != o.Ack() {
				t.Errorf("message %d: outcomes %v, answers %v; want it acknowledged by its last delivery only", i, outs, ans)
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
	if outs, a := outcomes[panics], answers[panics]; len(outs) == 0 || outs[0] != consumerx.Failed || len(a) == 0 || !errors.As(a[0], &pe) || pe.Value != "nil map" {
		t.Errorf("the panicking message: outcomes %v, answers %v; want Failed first, nacked with the panic", outs, a)
	}
	if d := dead[panics]; len(d) != 1 || !errors.Is(d[0], guard.ErrExhausted) || !errors.Is(d[0], guard.ErrPanicked) {
		t.Errorf("the panicking message's dead letters: %v; want one, exhausted by the panic", d)
	}
	if len(dead) != 1 {
		t.Errorf("dead letters %v; want the panicking message's alone", dead)
	}
}
