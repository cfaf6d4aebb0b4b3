package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// A batch effect's context, like Do's, is backed by a context of the
// context package only once its Done channel is asked for; these tests
// ask for it last, so they drive the state kept before that: Err,
// context.Cause and Value must answer as a context.WithCancelCause of the
// caller's would.

// The caller's cancellation shows in Err at once, with the caller's cause,
// before anything asked for Done; Done, asked for afterwards, is closed,
// and Err and the cause stay as they were.
func TestBatchEffectContextEndsWithCallerBeforeDone(t *testing.T) {
	g := realGuard(t, guard.Options{})
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), effectKey{}, "v"))
	defer cancel(nil)
	gone := errors.New("caller gone")
	res := g.DoBatch(parent, batchItems("effctx-caller", 1), func(ctx context.Context, _ int, _ guard.Lease) ([]byte, error) {
		if ctx.Err() != nil || ctx.Value(effectKey{}) != "v" {
			return nil, errors.New("effect context ended, or lost the caller's value, before the caller ended")
		}
		cancel(gone)
		if err := ctx.Err(); err != context.Canceled {
			return nil, errors.New("Err after the caller's cancellation = " + errString(err) + ", want context.Canceled")
		}
		if c := context.Cause(ctx); c != gone {
			return nil, errors.New("Cause = " + errString(c) + ", want the caller's")
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			return nil, errors.New("Done not closed after the caller's cancellation")
		}
		if ctx.Err() != context.Canceled || context.Cause(ctx) != gone || ctx.Value(effectKey{}) != "v" {
			return nil, errors.New("Err, Cause or Value changed once Done was asked for")
		}
		return nil, guard.ErrRejected
	}, guard.BatchOptions{})
	if !errors.Is(res[0].Err, guard.ErrRejected) {
		t.Fatal(res[0].Err)
	}
}

// A run ended by the guard (MaxRun here) shows its cause in Err and
// context.Cause to an effect that polls Err and never asked for Done, and
// a context derived afterwards ends at once with that cause. The other
// effect of the batch, which derived a context before and waits on it,
// sees both end with that cause.
func TestBatchEffectContextCauseWithoutDone(t *testing.T) {
	g := realGuard(t, guard.Options{Lease: 3 * time.Second, MaxRun: 50 * time.Millisecond})
	res := g.DoBatch(bg, batchItems("effctx-maxrun", 2), func(ctx context.Context, i int, _ guard.Lease) ([]byte, error) {
		if i == 1 {
			before, stop := context.WithCancel(ctx)
			defer stop()
			select {
			case <-before.Done():
			case <-time.After(10 * time.Second):
				return nil, errors.New("a context derived before MaxRun was not cancelled")
			}
			if !errors.Is(context.Cause(before), guard.ErrMaxRun) || !errors.Is(context.Cause(ctx), guard.ErrMaxRun) {
				return nil, errors.New("Cause = " + errString(context.Cause(before)) + ", want ErrMaxRun")
			}
			return nil, context.Cause(ctx)
		}
		limit := time.Now().Add(10 * time.Second)
		for ctx.Err() == nil {
			if time.Now().After(limit) {
				return nil, errors.New("Err still nil long after MaxRun")
			}
			time.Sleep(time.Millisecond)
		}
		if !errors.Is(context.Cause(ctx), guard.ErrMaxRun) {
			return nil, errors.New("Cause = " + errString(context.Cause(ctx)) + ", want ErrMaxRun")
		}
		after, stop := context.WithTimeout(ctx, time.Hour)
		defer stop()
		for _, c := range []context.Context{after, ctx} {
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				return nil, errors.New("a derived context was not cancelled")
			}
			if !errors.Is(context.Cause(c), guard.ErrMaxRun) {
				return nil, errors.New("derived Cause = " + errString(context.Cause(c)) + ", want ErrMaxRun")
			}
		}
		return nil, context.Cause(ctx)
	}, guard.BatchOptions{Concurrency: 2})
	for i := range res {
		if !errors.Is(res[i].Err, guard.ErrMaxRun) {
			t.Errorf("item %d: %v", i, res[i].Err)
		}
	}
}

// Once the batch has ended, an effect's context (kept past its effect)
// has ended with context.Canceled, and its Err and cause never change:
// the caller's later cancellation (with another cause) does not show,
// neither before nor after Done is asked for.
func TestBatchEffectContextEndIsFinal(t *testing.T) {
	g := realGuard(t, guard.Options{})
	parent, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var kept context.Context
	res := g.DoBatch(parent, batchItems("effctx-final", 1), func(ctx context.Context, _ int, _ guard.Lease) ([]byte, error) {
		kept = ctx
		return nil, ctx.Err()
	}, guard.BatchOptions{})
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	if kept.Err() != context.Canceled { // Err only: Cause would back the context now
		t.Fatalf("after the batch: Err %v, want context.Canceled", kept.Err())
	}
	cancel(errors.New("later"))
	if kept.Err() != context.Canceled || context.Cause(kept) != context.Canceled {
		t.Fatalf("after the caller's end: Err %v, Cause %v; want context.Canceled still", kept.Err(), context.Cause(kept))
	}
	<-kept.Done()
	if kept.Err() != context.Canceled || context.Cause(kept) != context.Canceled {
		t.Fatalf("after Done: Err %v, Cause %v; want context.Canceled still", kept.Err(), context.Cause(kept))
	}
}
