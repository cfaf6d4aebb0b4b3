package lock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// failSetHook fails every SET (a lock acquisition) sent through its client,
// as an unreachable node would.
type failSetHook struct{}

func (failSetHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (failSetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "set" {
			err := errors.New("injected: node unreachable")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (failSetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestObtainCancelledDuringLastAttemptWrapsCause: Obtain's doc says that
// when ctx ends while an attempt is under way, "Obtain returns
// ErrNotObtained wrapping ctx's cause, never a lock, once ctx has ended".
// Here ctx is cancelled as soon as a node answered the attempt's SET; the
// attempt then fails (the lock is held elsewhere, or no quorum answered).
// When that attempt is the last one Options.Tries (or UnavailableTries)
// allows, obtain returns the attempt's own error: no ctx cause, and
// ErrUnavailable instead of ErrNotObtained in the second case.
func TestObtainCancelledDuringLastAttemptWrapsCause(t *testing.T) {
	prefix := testenv.Prefix(t)
	holder := newLocker(t, redlockNodes(t), lock.Options{Prefix: prefix})
	k, err := holder.Obtain(bg, "acct")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = k.Release(bg) }()

	cases := []struct {
		name  string
		opts  lock.Options
		fault bool // nodes 1 and 2 fail every SET
	}{
		{"held elsewhere, Tries 1", lock.Options{Prefix: prefix, Tries: 1}, false},
		{"no quorum, UnavailableTries 1", lock.Options{Prefix: prefix, UnavailableTries: 1}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nodes := redlockNodes(t)
			ctx, cancel := context.WithCancel(bg)
			defer cancel()
			nodes[0].AddHook(setHook{after: cancel})
			if c.fault {
				nodes[1].AddHook(failSetHook{})
				nodes[2].AddHook(failSetHook{})
			}
			l := newLocker(t, nodes, c.opts)
			got, err := l.Obtain(ctx, "acct")
			if got != nil {
				_ = got.Release(bg)
				t.Fatal("Obtain returned a lock")
			}
			if ctx.Err() == nil {
				t.Fatal("ctx was not cancelled during the attempt: the test tested nothing")
			}
			if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
				t.Fatalf("ctx ended while the attempt was under way; Obtain = %v, want ErrNotObtained wrapping context.Canceled", err)
			}
		})
	}
}
