package fallback_test

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/memstore"
)

// TestStepsKeptOnlyWhereStoresKeepThem: a Store is always a
// guard.StepStore, but a step runs through it only when the stores it
// writes steps to keep them. Over a primary that keeps no steps (a
// wrapper that forwards only guard.Store), guard.Step answers
// guard.ErrStepsUnsupported before the step runs, in every attempt, where
// it used to run the step and then learn from SaveStep that nothing was
// kept, running it again in each attempt. Over a RedisStore the step runs
// once in all attempts. Under the Secondary policy the secondary must
// keep steps too.
func TestStepsKeptOnlyWhereStoresKeepThem(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	t.Cleanup(func() { _ = c.Close() })
	rs := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t)})

	for name, tc := range map[string]struct {
		primary guard.Store
		opts    fallback.Options
		keeps   bool
	}{
		"redis store":                   {rs, fallback.Options{}, true},
		"primary keeping no steps":      {plain{rs}, fallback.Options{}, false},
		"fail open, no steps":           {plain{rs}, fallback.Options{Policy: fallback.FailOpen}, false},
		"secondary keeping steps":       {rs, fallback.Options{Policy: fallback.Secondary, Secondary: memstore.New(memstore.Options{})}, true},
		"secondary keeping no steps":    {rs, fallback.Options{Policy: fallback.Secondary, Secondary: plain{memstore.New(memstore.Options{})}}, false},
		"primary wrapped by fallback":   {newStore(t, rs, fallback.Options{Logger: quiet}), fallback.Options{}, true},
		"no steps, wrapped by fallback": {newStore(t, plain{rs}, fallback.Options{Logger: quiet}), fallback.Options{}, false},
	} {
		t.Run(name, func(t *testing.T) {
			tc.opts.Logger = quiet
			s := newStore(t, tc.primary, tc.opts)
			if got := guard.KeepsSteps(s); got != tc.keeps {
				t.Errorf("KeepsSteps = %v, want %v", got, tc.keeps)
			}
			g := guard.New(s, guard.Options{MaxAttempts: 10})
			key := guard.Key{Scope: "steps", ID: name}
			ran := 0
			for attempt := range 3 {
				_, err := g.Do(bg, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
					if _, err := guard.Step(ctx, l, "xadd", func(context.Context) ([]byte, error) { ran++; return []byte("1-0"), nil }); err != nil {
						return nil, err
					}
					return nil, errors.New("crash after the step")
				})
				if !tc.keeps && !errors.Is(err, guard.ErrStepsUnsupported) {
					t.Fatalf("attempt %d: %v, want ErrStepsUnsupported", attempt, err)
				}
			}
			want := 0
			if tc.keeps {
				want = 1
			}
			if ran != want {
				t.Fatalf("the step ran %d times in 3 attempts, want %d", ran, want)
			}
		})
	}
}
