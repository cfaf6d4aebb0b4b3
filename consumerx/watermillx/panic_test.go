package watermillx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A handler that always panics is not redelivered for ever, with
// Watermill's Recoverer around the middleware (which turns the panic into
// an error, so the message is nacked) or without it: each panic is a
// failed attempt, the message is nacked (an error matching
// guard.ErrPanicked) and, after MaxAttempts, dead-lettered once and
// acknowledged, as a batch's panicking handler is. The panic does not go
// on out of the middleware.
func TestAlwaysPanickingHandlerDeadLettered(t *testing.T) {
	const maxAttempts = 3
	for _, recoverer := range []bool{false, true} {
		name := "bare"
		if recoverer {
			name = "recoverer"
		}
		t.Run(name, func(t *testing.T) {
			g, _, _ := consumertest.Guard(t, guard.Options{})
			var causes []error
			mw, err := New(g, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: maxAttempts,
				DeadLetter: func(_ context.Context, _ consumerx.Message, c error) error { causes = append(causes, c); return nil }}})
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			h := mw.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; panic("nil map") })
			if recoverer {
				h = middleware.Recoverer(h)
			}
			uuid := watermill.NewUUID()
			deliveries := 0
			for ; deliveries < 3*maxAttempts; deliveries++ {
				var err error
				panicked := func() (p any) {
					defer func() { p = recover() }()
					_, err = h(message.NewMessage(uuid, []byte("order 1")))
					return nil
				}()
				if panicked != nil {
					t.Errorf("delivery %d panicked out of the middleware: %v", deliveries+1, panicked)
					continue
				}
				if err == nil { // acknowledged
					break
				}
				if !errors.Is(err, guard.ErrPanicked) {
					t.Errorf("delivery %d: %v; want an error matching ErrPanicked", deliveries+1, err)
				}
			}
			var pe *guard.PanicError
			if runs != maxAttempts || deliveries != maxAttempts-1 || len(causes) != 1 || !errors.Is(causes[0], guard.ErrExhausted) ||
				!errors.As(causes[0], &pe) || pe.Value != "nil map" {
				t.Errorf("ran %d times, acknowledged at delivery %d, dead letters %v; want %d runs, acknowledged at the last, one dead letter exhausted by the panic",
					runs, deliveries+1, causes, maxAttempts)
			}
		})
	}
}

// Watermill's Timeout middleware ends the message's context at a
// deadline: a handler that then fails timed out, which is a failed
// attempt, not the consumer stopping. A handler that always times out is
// dead-lettered after MaxAttempts instead of being released and
// redelivered for ever; it still sees the deadline and its lease.
func TestAlwaysTimingOutHandlerDeadLettered(t *testing.T) {
	const maxAttempts = 3
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var causes []error
	mw, err := New(g, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: maxAttempts,
		DeadLetter: func(_ context.Context, _ consumerx.Message, c error) error { causes = append(causes, c); return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	h := middleware.Timeout(20 * time.Millisecond)(mw.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs++
		if _, ok := consumerx.LeaseFrom(msg.Context()); !ok {
			t.Error("the handler's context has no lease")
		}
		<-msg.Context().Done()
		return nil, fmt.Errorf("gateway: %w", msg.Context().Err())
	}))
	uuid := watermill.NewUUID()
	deliveries := 0
	for ; deliveries < 3*maxAttempts; deliveries++ {
		if _, err := h(message.NewMessage(uuid, []byte("order 1"))); err == nil {
			break
		}
	}
	if runs != maxAttempts || deliveries != maxAttempts-1 || len(causes) != 1 || !errors.Is(causes[0], guard.ErrExhausted) ||
		!errors.Is(causes[0], context.DeadlineExceeded) {
		t.Errorf("ran %d times, acknowledged at delivery %d, dead letters %v; want %d runs, acknowledged at the last, one dead letter exhausted by the timeout",
			runs, deliveries+1, causes, maxAttempts)
	}
}
