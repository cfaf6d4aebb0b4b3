package watermillx

import (
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
		mu      sync.Mutex
		answers = map[int][]error{} // what the handler chain told the router, per delivery
		started int
		all     = make(chan struct{}) // closed once every message began its first run
	)
	fpl := &consumertest.FailPanicLong{Lease: lease, Fails: fails, Panics: panics, Stuck: stuck, Long: long,
		Began: func(i int, first bool) {
			if !first {
				return
			}
			mu.Lock()
			if started++; started == 8 {
				close(all)
			}
			mu.Unlock()
			select {
			case <-all:
			case <-time.After(10 * time.Second):
				t.Errorf("message %d: the 8 messages did not run at once", i)
			}
		}}
	num := func(payload []byte) int {
		var i int
		if _, err := fmt.Sscanf(string(payload), "charge %d", &i); err != nil {
			t.Errorf("message %q: %v", payload, err)
		}
		return i
	}
	mw, err := New(g, Options{Group: "billing", InProgressDelay: 50 * time.Millisecond,
		Process: fpl.Process(consumerx.Options{Logger: testenv.Logger(t)}, func(msg consumerx.Message) int { return num(msg.Payload) })})
	if err != nil {
		t.Fatal(err)
	}
	handle := func(msg *message.Message) error { return fpl.Run(msg.Context(), num(msg.Payload)) }
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

	fpl.Check(t, "message")
	// The router was told to acknowledge a delivery exactly when its
	// outcome acknowledged it, and to nack the panic with its value.
	mu.Lock()
	defer mu.Unlock()
	for i := range 8 {
		outs, ans := fpl.Outcomes(i), answers[i]
		if len(outs) != len(ans) {
			t.Errorf("message %d: outcomes %v, answers %v; want one of each a delivery", i, outs, ans)
			continue
		}
		for k, o := range outs {
			if (ans[k] == nil) != o.Ack() {
				t.Errorf("message %d: outcomes %v, answers %v; want the router told to acknowledge as the outcome says", i, outs, ans)
				break
			}
		}
	}
	var pe *guard.PanicError
	if a := answers[panics]; len(a) == 0 || !errors.As(a[0], &pe) || pe.Value != "nil map" {
		t.Errorf("the panicking message's answers %v; want it nacked with the panic", a)
	}
}
