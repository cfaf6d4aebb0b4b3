package guard_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// freeHook is a real store (without batches: DoBatch ends each claim with
// its own call) whose Fail and Release, once the store has taken them and
// the key is free for another claim, run hook before the answer reaches
// the holder: the reply is on its way back.
type freeHook struct {
	guard.Store
	hook func()
}

func (s *freeHook) Fail(ctx context.Context, l guard.Lease, reason string, ttl time.Duration) error {
	err := s.Store.Fail(ctx, l, reason, ttl)
	if err == nil && s.hook != nil {
		s.hook()
	}
	return err
}

func (s *freeHook) Release(ctx context.Context, l guard.Lease) error {
	err := s.Store.Release(ctx, l)
	if err == nil && s.hook != nil {
		s.hook()
	}
	return err
}

// TestEffectContextEndsBeforeKeyFreed: "its context is done before any
// other claim of the key can succeed" (docs/design.md) holds for a holder
// that fails or releases its claim, through Do, Hold and DoBatch: a failed
// key with attempts left, or a released first attempt, is free for
// another claim once the store has the write, before its answer is back.
// The effect's context stayed live until that answer came (work the
// effect left running, a goroutine or a Step, ran beside the next
// holder's effect; found by review).
func TestEffectContextEndsBeforeKeyFreed(t *testing.T) {
	for _, via := range []string{"Do", "Hold", "DoBatch"} {
		for _, end := range []struct {
			name string
			err  error
		}{{"fail", errors.New("declined")}, {"release", guard.ErrRejected}} {
			t.Run(via+"/"+end.name, func(t *testing.T) {
				h := &freeHook{Store: realStore(t)}
				g := guard.New(h, guard.Options{Lease: time.Second})
				other := guard.New(h.Store, guard.Options{Lease: time.Second})
				key := guard.Key{Scope: "free-ctx", ID: t.Name()}
				var effect context.Context
				var otherGot guard.Outcome
				var otherErr error
				liveWhenTaken := false
				h.hook = func() {
					otherGot, otherErr = other.Claim(bg, key, "fp")
					if otherErr == nil && otherGot.Status == guard.Acquired {
						liveWhenTaken = effect.Err() == nil
						_ = other.Release(bg, otherGot.Lease)
					}
				}
				fn := func(ctx context.Context) ([]byte, error) {
					effect = ctx
					return nil, end.err
				}
				switch via {
				case "Do":
					_, err := g.Do(bg, key, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) { return fn(ctx) })
					if !errors.Is(err, end.err) {
						t.Fatalf("Do: %v", err)
					}
				case "Hold":
					_, held, err := g.Hold(bg, key, "fp")
					if err != nil {
						t.Fatal(err)
					}
					_, ferr := fn(held.Context())
					if errors.Is(ferr, guard.ErrRejected) {
						err = held.Release()
					} else {
						err = held.Fail(ferr)
					}
					if err != nil {
						t.Fatal(err)
					}
				case "DoBatch":
					res := g.DoBatch(bg, []guard.BatchItem{{Key: key, Fingerprint: "fp"}}, func(ctx context.Context, _ int, _ guard.Lease) ([]byte, error) {
						return fn(ctx)
					}, guard.BatchOptions{})
					if !errors.Is(res[0].Err, end.err) {
						t.Fatalf("DoBatch: %v", res[0].Err)
					}
				}
				if otherErr != nil || otherGot.Status != guard.Acquired {
					t.Fatalf("the other claim did not take the freed key: %+v %v", otherGot, otherErr)
				}
				if liveWhenTaken {
					t.Fatal("another claim acquired the key while the first holder's effect context was still live")
				}
			})
		}
	}
}
