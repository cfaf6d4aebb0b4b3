package consumerx_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// A consumer stopped while the handler runs releases the claim: no
// attempt is counted, nothing is dead-lettered, however often it happens;
// the handler's own errors still count.
func TestShutdownIsNotFailure(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead atomic.Int32
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 2,
		DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }})
	key, _ := p.Key(order)
	h := consumertest.NewInterrupted(5)
	stopMidHandler := func() (consumerx.Outcome, error) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			h.WaitStarted(t, 10*time.Second)
			cancel() // the consumer shuts down while the handler runs
		}()
		return p.Process(ctx, order, h.Handle)
	}
	for i := range 3 {
		o, err := stopMidHandler()
		if o != consumerx.Interrupted || o.Ack() || !errors.Is(err, context.Canceled) {
			t.Fatalf("stop %d: %s, %v; want interrupted, not acknowledged", i+1, o, err)
		}
		if _, err := g.Get(context.Background(), key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("stop %d: record %v, want released", i+1, err)
		}
	}
	// The handler's own error, the consumer's context live: an attempt.
	fail := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	if o, err := p.Process(context.Background(), order, fail); o != consumerx.Failed || err == nil {
		t.Fatalf("handler error: %s, %v; want failed", o, err)
	}
	for i := range 2 {
		if o, _ := stopMidHandler(); o != consumerx.Interrupted {
			t.Fatalf("stop %d after a failure: %s", i+4, o)
		}
		rec, err := g.Get(context.Background(), key)
		if err != nil || rec.State != guard.StateFailed || rec.Attempt != 1 {
			t.Fatalf("after a stop following a failure: %+v, %v; want failed with 1 attempt", rec, err)
		}
	}
	var lease guard.Lease
	ok := func(ctx context.Context, msg consumerx.Message) error {
		lease, _ = consumerx.LeaseFrom(ctx)
		return h.Handle(ctx, msg)
	}
	if o, err := p.Process(context.Background(), order, ok); o != consumerx.Processed || err != nil {
		t.Fatalf("last delivery: %s, %v", o, err)
	}
	if h.Effects.Load() != 1 || dead.Load() != 0 || lease.Attempt != 2 {
		t.Fatalf("effects %d, dead letters %d, attempt %d; want 1, 0, 2", h.Effects.Load(), dead.Load(), lease.Attempt)
	}

	// A handler that finishes its work although the consumer is stopping:
	// the message is done.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other := consumerx.Message{ID: "order-2", Payload: []byte("x")}
	finishes := func(context.Context, consumerx.Message) error { cancel(); return nil }
	if o, err := p.Process(ctx, other, finishes); o != consumerx.Processed || err != nil {
		t.Fatalf("stopped consumer, handler succeeded: %s, %v; want processed", o, err)
	}
}

// A consumer's context cancelled with a cause of its own
// (context.WithCancelCause, as errgroup and signal handlers do) stops it
// as plainly cancelled ones do: the messages whose turn had not come are
// Interrupted, not Failed (which a JetStream consumer Naks with
// RetryDelay, and logs as a failure).
func TestShutdownWithCauseInterrupts(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	shutdown := errors.New("SIGTERM")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	msgs := []consumerx.Message{{ID: "m0", Payload: []byte("a")}, {ID: "m1", Payload: []byte("b")}}
	res := p.ProcessBatch(ctx, msgs, func(context.Context, consumerx.Message) error {
		cancel(shutdown)
		return nil
	}, consumerx.BatchOptions{})
	if res[0].Outcome != consumerx.Processed || res[1].Outcome != consumerx.Interrupted || !errors.Is(res[1].Err, shutdown) {
		t.Errorf("batch stopped with a cause: %+v; want processed, interrupted (with the cause)", res)
	}
	for i, r := range p.ProcessBatch(ctx, msgs[1:], func(context.Context, consumerx.Message) error {
		t.Error("a handler ran after shutdown")
		return nil
	}, consumerx.BatchOptions{}) {
		if r.Outcome != consumerx.Interrupted {
			t.Errorf("after shutdown with a cause, %s: %s, %v; want interrupted", msgs[i+1].ID, r.Outcome, r.Err)
		}
	}
	if o, err := p.Process(ctx, msgs[1], func(context.Context, consumerx.Message) error {
		t.Error("a handler ran after shutdown")
		return nil
	}); o != consumerx.Interrupted {
		t.Errorf("Process after shutdown with a cause: %s, %v; want interrupted", o, err)
	}
}

// A message whose last attempt failed just before the consumer stopped is
// not dead-lettered in a stopped consumer: it is Interrupted (not
// acknowledged, not reported as a failure), and its next delivery
// dead-letters it, once. So is one whose DeadLetter gave up because the
// consumer's context ended while it ran.
func TestShutdownBeforeDeadLetterInterrupts(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead int
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(ctx context.Context, _ consumerx.Message, _ error) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			dead++
			return nil
		}})
	ctx, cancel := context.WithCancel(context.Background())
	msgs := []consumerx.Message{{ID: "m0", Payload: []byte("a")}, {ID: "m1", Payload: []byte("b")}}
	res := p.ProcessBatch(ctx, msgs, func(_ context.Context, msg consumerx.Message) error {
		if msg.ID == "m1" {
			cancel() // the consumer stops after m0's last attempt failed
			return nil
		}
		return errors.New("declined")
	}, consumerx.BatchOptions{})
	if res[0].Outcome != consumerx.Interrupted || res[1].Outcome != consumerx.Processed || dead != 0 {
		t.Errorf("batch: %+v, dead letters %d; want interrupted, processed, none", res, dead)
	}
	// The dead letter itself stopped by the shutdown.
	stopping, stop := context.WithCancel(context.Background())
	p2 := newProcessor(t, g, "audit", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(context.Context, consumerx.Message, error) error { stop(); return context.Canceled }})
	if o, err := p2.Process(stopping, msgs[0], func(context.Context, consumerx.Message) error { return errors.New("declined") }); o != consumerx.Interrupted {
		t.Errorf("dead letter stopped by the shutdown: %s, %v; want interrupted", o, err)
	}
	// The next delivery dead-letters it, once.
	for range 2 {
		if o, err := p.Process(context.Background(), msgs[0], func(context.Context, consumerx.Message) error {
			t.Error("ran after its attempts ran out")
			return nil
		}); o != consumerx.DeadLettered {
			t.Errorf("redelivery: %s, %v; want dead_lettered", o, err)
		}
	}
	if dead != 1 {
		t.Errorf("dead letters %d, want 1", dead)
	}
}
