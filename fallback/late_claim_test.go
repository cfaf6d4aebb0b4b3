package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// TestLateClaimReleased: Redis stalls (CLIENT PAUSE WRITE) past the
// fallback's Timeout while a claim is on its way; the caller is answered
// ErrUnavailable at the bound, and Redis takes the claim once the pause
// ends. Nobody holds that lease: it must be given back, as guard gives
// back a claim answered after its lease's deadline, not left pending
// for the whole lease (every retry told the key is in progress, then an
// attempt counted for an effect that never ran).
func TestLateClaimReleased(t *testing.T) {
	t.Parallel()
	p := newPrimary(t)
	s := newStore(t, p.store, fallback.Options{Timeout: 200 * time.Millisecond, FailuresToOpen: 100, Logger: quiet})
	admin := p.srv.Client()
	key := guard.Key{Scope: "late", ID: t.Name()}
	req := guard.ClaimRequest{Key: key, Token: "LATE", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}

	if err := admin.Do(bg, "CLIENT", "PAUSE", "10000", "WRITE").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(bg, req); !isUnavailable(err) {
		t.Fatalf("claim during the stall = %v, want ErrUnavailable", err)
	}
	// The stall ends; Redis runs the late claim. A retry must have the
	// key well within the late claim's lease, as a first attempt.
	if err := admin.Do(bg, "CLIENT", "UNPAUSE").Err(); err != nil {
		t.Fatal(err)
	}
	next := guard.ClaimRequest{Key: key, Token: "NEXT", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	var out guard.Outcome
	waitFor(t, 5*time.Second, "a retry acquiring the key", func() bool {
		var err error
		out, err = s.Claim(bg, next)
		if isUnavailable(err) && !errors.Is(err, fallback.ErrBreakerOpen) {
			// This retry too was not answered within the Timeout (a
			// loaded machine): try again. Were it taken late, it is
			// given back as the late claim is.
			return false
		}
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		return out.Status == guard.Acquired
	})
	if out.Lease.Attempt != 1 {
		t.Fatalf("retry = %+v; want a first attempt", out)
	}
}

// stall puts p's Redis to sleep for d (DEBUG SLEEP: it reads nothing, so
// a command sent meanwhile waits in its socket and is run as it wakes,
// even from a client that gave up and closed the connection). It returns
// once the server has stopped answering, with a channel that hears the
// sleep's end.
func stall(t *testing.T, p primary, d time.Duration) <-chan error {
	t.Helper()
	admin := p.srv.Client()
	probe := redis.NewClient(&redis.Options{Addr: p.srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = probe.Close() })
	if err := probe.Ping(bg).Err(); err != nil {
		t.Fatal(err)
	}
	woke := make(chan error, 1)
	go func() { woke <- admin.Do(bg, "DEBUG", "SLEEP", fmt.Sprintf("%.3f", d.Seconds())).Err() }()
	waitFor(t, d/2, "the server asleep", func() bool {
		ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
		defer cancel()
		return probe.Ping(ctx).Err() != nil
	})
	return woke
}

// warm has s's primary connected, so that a claim made during a stall is
// sent, not held up dialling.
func warm(t *testing.T, s *fallback.Store) {
	t.Helper()
	if _, err := s.Get(bg, guard.Key{Scope: "late", ID: "warm"}); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("warm-up get: %v", err)
	}
}

// TestLateClaimReleasedUnderDeadlines is TestLateClaimReleased for a
// primary that ends its calls by their context's deadline (go-redis with
// ContextTimeoutEnabled, whose other calls the fallback makes inline): the
// claim is cut off at the Timeout only for its caller. Were the client cut
// off too, it would close the connection, Redis would run the claim as it
// woke, and nobody would be left to hear and release it: every retry told
// in progress for the claim's whole lease. Through guard.Do as well: the
// call during the stall fails with nothing run, and a retry after it runs
// the effect.
func TestLateClaimReleasedUnderDeadlines(t *testing.T) {
	honours := func(o *redis.Options) { o.ContextTimeoutEnabled = true }
	opts := fallback.Options{Timeout: 200 * time.Millisecond, FailuresToOpen: 100, Logger: quiet}

	t.Run("store", func(t *testing.T) {
		p := newPrimary(t, honours)
		s := newStore(t, p.store, opts)
		key := guard.Key{Scope: "late", ID: t.Name()}
		warm(t, s)
		woke := stall(t, p, time.Second)
		if _, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "LATE", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); !isUnavailable(err) {
			t.Fatalf("claim during the stall = %v, want ErrUnavailable", err)
		}
		if err := <-woke; err != nil {
			t.Fatal(err)
		}
		next := guard.ClaimRequest{Key: key, Token: "NEXT", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		var out guard.Outcome
		waitFor(t, 5*time.Second, "a retry acquiring the key (the late claim left pending for its 1m lease)", func() bool {
			var err error
			out, err = s.Claim(bg, next)
			if err != nil && !errors.Is(err, guard.ErrInProgress) {
				t.Fatalf("retry: %v", err)
			}
			return err == nil && out.Status == guard.Acquired
		})
		if out.Lease.Attempt != 1 {
			t.Fatalf("retry = %+v; want a first attempt", out)
		}
	})

	t.Run("guard", func(t *testing.T) {
		p := newPrimary(t, honours)
		s := newStore(t, p.store, opts)
		g := guard.New(s, guard.Options{Lease: time.Minute})
		key := guard.Key{Scope: "late", ID: t.Name()}
		warm(t, s)
		var ran atomic.Int32
		fn := func(context.Context, guard.Lease) ([]byte, error) { ran.Add(1); return []byte("ok"), nil }
		woke := stall(t, p, time.Second)
		if _, err := g.Do(bg, key, "fp", fn); !isUnavailable(err) {
			t.Fatalf("Do during the stall = %v, want ErrUnavailable", err)
		}
		if err := <-woke; err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "a retry running the effect (the late claim left pending for its 1m lease)", func() bool {
			_, err := g.Do(bg, key, "fp", fn)
			if err != nil && !errors.Is(err, guard.ErrInProgress) {
				t.Fatalf("retry: %v", err)
			}
			return err == nil
		})
		if n := ran.Load(); n != 1 {
			t.Fatalf("the effect ran %d times", n)
		}
	})
}
