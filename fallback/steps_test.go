package fallback_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
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
			storetest.StepRunsWhereKept(t, s, guard.Key{Scope: "steps", ID: name}, tc.keeps)
		})
	}
}
