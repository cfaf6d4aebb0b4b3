package guard_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// The Guard's own share of the allocations of a fresh Do and of a replay,
// against real Redis: Do's allocations less those of the bare store calls
// it makes (Claim and Complete; Claim), for a caller's context that
// cannot be cancelled and for one that can (a request's, a consumer's).
// The guard adds one context for the effect, its keepalive with the
// token in it and one timer; a cancellable caller's context costs no
// watch of its own.
func TestGuardAllocations(t *testing.T) {
	s := realStore(t)
	g := guard.New(s, guard.Options{})
	effect := func(context.Context, guard.Lease) ([]byte, error) { return value, nil }
	ids := make([]string, 8000)
	for i := range ids {
		ids[i] = strconv.Itoa(i)
	}
	next := 0
	key := func() guard.Key { next++; return guard.Key{Scope: "alloc", ID: ids[next]} }
	const runs = 500
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()

	for _, c := range []struct {
		name                string
		ctx                 context.Context
		maxFresh, maxReplay float64
	}{
		// Measured 6 and 4, and 7 and 6 with a cancellable context (the
		// effect's context, made before the claim, is then the claim's
		// watch of the caller's); before, a watch of its own made that 9
		// and 7. A context.WithTimeout costs 4-5 allocations, a heartbeat
		// timer with its context 4: either one back per call shows.
		{"background", context.Background(), 7, 5},
		{"cancellable", cancellable, 8, 7},
	} {
		ctx := c.ctx
		fresh := testing.AllocsPerRun(runs, func() {
			if _, err := g.Do(ctx, key(), "fp", effect); err != nil {
				t.Fatal(err)
			}
		})
		bare := testing.AllocsPerRun(runs, func() {
			k := key()
			out, err := s.Claim(ctx, guard.ClaimRequest{Key: k, Token: "T", Fingerprint: "fp", Lease: guard.DefaultLease, TTL: guard.DefaultTTL})
			if err != nil || out.Status != guard.Acquired {
				t.Fatal(out, err)
			}
			if err := s.Complete(ctx, out.Lease, value, time.Hour); err != nil {
				t.Fatal(err)
			}
		})
		done := guard.Key{Scope: "alloc", ID: "done"}
		if _, err := g.Do(ctx, done, "fp", effect); err != nil && !errors.Is(err, guard.ErrMismatch) {
			t.Fatal(err)
		}
		replay := testing.AllocsPerRun(runs, func() {
			if res, err := g.Do(ctx, done, "fp", effect); err != nil || !res.Replayed {
				t.Fatal(res, err)
			}
		})
		bareReplay := testing.AllocsPerRun(runs, func() {
			if out, err := s.Claim(ctx, guard.ClaimRequest{Key: done, Token: "T", Fingerprint: "fp", Lease: guard.DefaultLease, TTL: guard.DefaultTTL}); err != nil || out.Status != guard.Replay {
				t.Fatal(out, err)
			}
		})
		t.Logf("%s: fresh Do: %.1f allocs (store calls %.1f, guard %.1f); replay: %.1f (store %.1f, guard %.1f)",
			c.name, fresh, bare, fresh-bare, replay, bareReplay, replay-bareReplay)
		if fresh-bare > c.maxFresh || replay-bareReplay > c.maxReplay {
			t.Errorf("%s: the guard adds %.1f allocations to a fresh key and %.1f to a replay, want at most %.0f and %.0f",
				c.name, fresh-bare, replay-bareReplay, c.maxFresh, c.maxReplay)
		}
	}
}
