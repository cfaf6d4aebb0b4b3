package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// A handler's error is a failed attempt whatever it wraps, even one of
// the guard's own sentinels (a handler that runs a guard of its own and
// returns what it answered): at the last attempt the message is
// dead-lettered, once, and acknowledged; it is never taken for another
// outcome. (A handler's error wrapping guard.ErrSkipped made the message
// Skipped: not acknowledged, not dead-lettered in that delivery.)
func TestHandlerErrorWrappingGuardSentinelIsAnAttempt(t *testing.T) {
	sentinels := map[string]error{
		"skipped":     guard.ErrSkipped,
		"in_progress": &guard.InProgressError{Key: guard.Key{Scope: "s", ID: "x"}},
		"exhausted":   &guard.ExhaustedError{Key: guard.Key{Scope: "s", ID: "x"}, Attempts: 3},
		"mismatch":    guard.ErrMismatch,
		"invalid_key": guard.ErrInvalidKey,
		"panicked":    &guard.PanicError{Key: guard.Key{Scope: "s", ID: "x"}, Value: "boom"},
		"unavailable": guard.ErrUnavailable,
		"lease_lost":  guard.ErrLeaseLost,
		"canceled":    context.Canceled,
		"no_key":      consumerx.ErrNoKey,
	}
	for name, sentinel := range sentinels {
		t.Run(name, func(t *testing.T) {
			g, _, _ := consumertest.Guard(t, guard.Options{})
			var dead atomic.Int32
			p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
				DeadLetter: func(_ context.Context, _ consumerx.Message, cause error) error {
					if !errors.Is(cause, guard.ErrExhausted) {
						t.Errorf("dead-letter cause %v; want ErrExhausted", cause)
					}
					dead.Add(1)
					return nil
				}})
			var runs atomic.Int32
			h := func(context.Context, consumerx.Message) error {
				runs.Add(1)
				return fmt.Errorf("nested call: %w", sentinel)
			}
			ctx := context.Background()
			msgs := batchOf(2)
			for range 2 {
				if o, err := p.Process(ctx, msgs[0], h); o != consumerx.DeadLettered {
					t.Errorf("Process: %s, %v; want dead_lettered", o, err)
				}
				r := p.ProcessBatch(ctx, msgs[1:], h, consumerx.BatchOptions{})[0]
				if r.Outcome != consumerx.DeadLettered {
					t.Errorf("ProcessBatch: %s, %v; want dead_lettered", r.Outcome, r.Err)
				}
			}
			if runs.Load() != 2 || dead.Load() != 2 {
				t.Errorf("runs %d, dead letters %d; want 2, 2 (one of each message)", runs.Load(), dead.Load())
			}
		})
	}
}

// A handler's error that wraps guard.ErrRejected (a lock.Guarded
// section inside the handler, its resource taken) is a failed attempt too,
// as every handler error is: the message is dead-lettered after
// MaxAttempts, as the store's record says. (The guard released the claim
// instead, uncounted: a handler rejected every time was never
// dead-lettered, holding a Kafka partition for ever; and with MaxAttempts
// 1 the message was dead-lettered while its record said it never ran.)
func TestHandlerRejectionCountsAsAttempt(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead atomic.Int32
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 2,
		DeadLetter: func(_ context.Context, _ consumerx.Message, cause error) error {
			var ex *guard.ExhaustedError
			if !errors.As(cause, &ex) || ex.Attempts != 2 || !errors.Is(cause, guard.ErrRejected) {
				t.Errorf("dead-letter cause %v; want ErrExhausted after 2 attempts, wrapping the handler's", cause)
			}
			dead.Add(1)
			return nil
		}})
	var runs atomic.Int32
	h := func(context.Context, consumerx.Message) error {
		runs.Add(1)
		return fmt.Errorf("lock: resource taken: %w", guard.ErrRejected)
	}
	ctx := context.Background()
	msgs := batchOf(2)
	F, L := consumerx.Failed, consumerx.DeadLettered
	for i, want := range []consumerx.Outcome{F, L, L} {
		if o, err := p.Process(ctx, msgs[0], h); o != want || (o == F && !errors.Is(err, guard.ErrRejected)) {
			t.Errorf("Process, delivery %d: %s, %v; want %s", i+1, o, err, want)
		}
		if r := p.ProcessBatch(ctx, msgs[1:], h, consumerx.BatchOptions{})[0]; r.Outcome != want {
			t.Errorf("ProcessBatch, delivery %d: %s, %v; want %s", i+1, r.Outcome, r.Err, want)
		}
	}
	if runs.Load() != 4 || dead.Load() != 2 {
		t.Errorf("runs %d, dead letters %d; want 4 (two per message), 2", runs.Load(), dead.Load())
	}
	for _, msg := range msgs {
		rec, err := g.Get(ctx, guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msg.ID})
		if err != nil || rec.State != guard.StateFailed || rec.Attempt != 2 {
			t.Errorf("%s's record %+v, %v; want failed after 2 attempts", msg.ID, rec, err)
		}
	}
}

// A nil handler is a programmer's error, as a nil guard.Func is:
// Process, ProcessResult and ProcessBatch panic naming the call before
// any claim reaches the store. (ProcessBatch took the nil call's panic
// for each message's failed attempt: after MaxAttempts deliveries every
// message was dead-lettered, none ever run.)
func TestNilHandlerPanicsBeforeAnyClaim(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	ctx := context.Background()
	msgs := batchOf(2)
	calls := map[string]func(){
		"Process":       func() { p.Process(ctx, msgs[0], nil) },
		"ProcessResult": func() { p.ProcessResult(ctx, msgs[0], nil) },
		"ProcessBatch":  func() { p.ProcessBatch(ctx, msgs, nil, consumerx.BatchOptions{}) },
	}
	for name, call := range calls {
		func() {
			defer func() {
				if v := recover(); v == nil {
					t.Errorf("%s with a nil handler did not panic", name)
				}
			}()
			call()
		}()
		for _, msg := range msgs {
			if rec, err := g.Get(ctx, guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msg.ID}); !errors.Is(err, guard.ErrNotFound) {
				t.Errorf("%s: %s's record %+v, %v; want none", name, msg.ID, rec, err)
			}
		}
	}
}
