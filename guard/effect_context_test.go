package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// The effect's context is backed by a context of the context package only
// once its Done channel is asked for; these tests ask for it last, so they
// drive the state kept before that: Err, context.Cause and Value must
// answer as a context.WithCancelCause of the caller's would.

type effectKey struct{}

// The caller's cancellation shows in Err at once, with the caller's cause,
// before anything asked for Done; Done, asked for afterwards, is closed,
// and Err and the cause stay as they were.
func TestEffectContextEndsWithCallerBeforeDone(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{})
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), effectKey{}, "v"))
	defer cancel(nil)
	gone := errors.New("caller gone")
	_, err := g.Do(parent, guard.Key{Scope: "effctx", ID: "caller"}, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
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
	})
	if !errors.Is(err, guard.ErrRejected) {
		t.Fatal(err)
	}
}

// A run ended by the guard (MaxRun here) shows its cause in Err and
// context.Cause to an effect that polls Err and never asked for Done (nor
// derived a context, which asks for it), and a context derived afterwards
// ends at once with that cause. (A context derived before the end:
// TestBatchEffectContextCauseWithoutDone, on the same effectCtx.)
func TestEffectContextCauseWithoutDone(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{Lease: 3 * time.Second, MaxRun: 50 * time.Millisecond})
	_, err := g.Do(bg, guard.Key{Scope: "effctx", ID: "maxrun"}, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
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
		after, stop2 := context.WithTimeout(ctx, time.Hour)
		defer stop2()
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
	})
	if !errors.Is(err, guard.ErrMaxRun) {
		t.Fatal(err)
	}
}

// Once ended, the context's Err and cause never change: the caller's later
// cancellation (with another cause) does not show, neither before nor
// after Done is asked for.
func TestEffectContextEndIsFinal(t *testing.T) {
	g := guard.New(realStore(t), guard.Options{})
	parent, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	out, h, err := g.Hold(parent, guard.Key{Scope: "effctx", ID: "final"}, "fp")
	if err != nil || h == nil {
		t.Fatal(out, err)
	}
	ctx := h.Context()
	if ctx.Err() != nil {
		t.Fatal(ctx.Err())
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != context.Canceled { // Err only: Cause would back the context now
		t.Fatalf("after Release: Err %v, want context.Canceled", ctx.Err())
	}
	cancel(errors.New("later"))
	if ctx.Err() != context.Canceled || context.Cause(ctx) != context.Canceled {
		t.Fatalf("after the caller's end: Err %v, Cause %v; want context.Canceled still", ctx.Err(), context.Cause(ctx))
	}
	<-ctx.Done()
	if ctx.Err() != context.Canceled || context.Cause(ctx) != context.Canceled {
		t.Fatalf("after Done: Err %v, Cause %v; want context.Canceled still", ctx.Err(), context.Cause(ctx))
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
