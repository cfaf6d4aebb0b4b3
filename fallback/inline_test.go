package fallback_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// forwarding wraps a Store as promx's Metrics.Store does, and forwards
// guard.DeadlineStore.
type forwarding struct{ guard.Store }

func (f forwarding) HonoursDeadline() bool {
	ds, ok := f.Store.(guard.DeadlineStore)
	return ok && ds.HonoursDeadline()
}

// plain wraps a Store and forwards nothing but guard.Store.
type plain struct{ guard.Store }

// TestInlineThroughWrappers: the primary's calls but claims run on the
// caller's goroutine exactly when the primary says, through
// guard.DeadlineStore, that they end by their context's deadline: a
// RedisStore on a client with ContextTimeoutEnabled, bare or behind a
// wrapper that forwards the interface. Behind a wrapper that does not, or
// on a client without ContextTimeoutEnabled, each call gets a goroutine of
// its own (and is still bounded); a claim always does.
func TestInlineThroughWrappers(t *testing.T) {
	for name, tc := range map[string]struct {
		ctxTimeouts bool
		wrap        func(guard.Store) guard.Store
		inline      bool
	}{
		"redis store":         {true, func(s guard.Store) guard.Store { return s }, true},
		"forwarding wrapper":  {true, func(s guard.Store) guard.Store { return forwarding{s} }, true},
		"plain wrapper":       {true, func(s guard.Store) guard.Store { return plain{s} }, false},
		"no context timeouts": {false, func(s guard.Store) guard.Store { return forwarding{s} }, false},
	} {
		t.Run(name, func(t *testing.T) {
			c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t), ContextTimeoutEnabled: tc.ctxTimeouts})
			t.Cleanup(func() { _ = c.Close() })
			seen := &testenv.Senders{}
			c.AddHook(seen)
			rs := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t), Unpipelined: true})
			s := newStore(t, tc.wrap(rs), fallback.Options{Logger: quiet})
			key := guard.Key{Scope: "inline", ID: "k"}
			if out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "T", Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute}); err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim: %v, %v", out.Status, err)
			}
			me, claimed := testenv.GoroutineID(), len(seen.IDs())
			if err := s.Complete(bg, guard.Lease{Key: key, Token: "T"}, []byte("ok"), time.Minute); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Get(bg, key); err != nil {
				t.Fatal(err)
			}
			ids := seen.IDs()
			if claimed < 1 || len(ids)-claimed < 2 {
				t.Fatalf("%d commands seen for the claim, %d after it; want at least 1 and 2", claimed, len(ids)-claimed)
			}
			for i, id := range ids {
				// A claim is never inline (TestLateClaimReleasedUnderDeadlines).
				if want := tc.inline && i >= claimed; (id == me) != want {
					t.Fatalf("command %d sent from goroutine %s, the caller is %s: want inline %t", i, id, me, want)
				}
			}
		})
	}
}
