package fallback_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/pgstore"
)

// counting counts the claims and the reads that reach the store it wraps.
type counting struct {
	guard.Store
	claims, gets atomic.Int64
}

func (c *counting) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, req)
}

func (c *counting) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, key)
}

// TestWaitReadsWhileSecondaryHolds: guard.Wait over a Store whose key is
// held where the Store's Get finds it: in the secondary while the breaker
// is open; in the secondary after the switch-back (the primary has no
// record); in the secondary's tables through a backstop.Wrap primary's
// mark while the breaker is open. Get reports the live hold (a pending
// record with its lease left), so Wait only reads until its timeout: no
// claim reaches either store.
func TestWaitReadsWhileSecondaryHolds(t *testing.T) {
	t.Parallel()
	const timeout = 1500 * time.Millisecond
	for _, c := range []struct {
		name     string
		backstop bool // the primary is backstop.Wrap on the secondary's tables
		back     bool // Redis is back, the breaker closed, before Wait
	}{
		{"secondary, breaker open", false, false},
		{"secondary, switched back", false, true},
		{"backstop mark, breaker open", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := newPrimary(t)
			pg, db := pgStore(t)
			var inner guard.Store = p.store
			if c.backstop {
				b, err := backstop.New(db, pgstore.Options{})
				if err != nil {
					t.Fatal(err)
				}
				inner = backstop.Wrap(p.store, b)
			}
			primary, secondary := &counting{Store: inner}, &counting{Store: pg}
			openFor := time.Hour
			if c.back {
				openFor = 300 * time.Millisecond
			}
			s := newStore(t, primary, fallback.Options{Policy: fallback.Secondary, Secondary: secondary,
				FailuresToOpen: 1, OpenTimeout: openFor, Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet})
			g := guard.New(s, guard.Options{Lease: time.Minute})
			k := key(t.Name())
			if c.backstop {
				// The holder claims through Redis, which then dies: its
				// mark in the secondary's tables holds the key.
				if out, err := g.Claim(bg, k, "fp"); err != nil || out.Status != guard.Acquired {
					t.Fatalf("claim: %+v, %v", out, err)
				}
			}
			p.srv.Kill()
			openBreaker(t, s)
			if !c.backstop {
				if out, err := g.Claim(bg, k, "fp"); err != nil || out.Status != guard.Acquired {
					t.Fatalf("claim in the secondary: %+v, %v", out, err)
				}
			}
			if c.back {
				p.srv.Restart()
				closeBreaker(t, s, 20*time.Second)
			}
			before := primary.claims.Load() + secondary.claims.Load()
			_, err := g.Wait(bg, k, "fp", guard.WaitOptions{Timeout: timeout})
			var ip *guard.InProgressError
			if !errors.As(err, &ip) || ip.RetryAfter <= 0 || ip.RetryAfter > time.Minute {
				t.Fatalf("Wait = %v; want *InProgressError with the holder's lease left", err)
			}
			if n := primary.claims.Load() + secondary.claims.Load() - before; n != 0 {
				t.Errorf("Wait made %d claims in %s while the holder's lease lived, want none", n, timeout)
			}
		})
	}
}
