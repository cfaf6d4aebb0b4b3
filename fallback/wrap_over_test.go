package fallback_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
)

// TestWrapOverFallback: the order the documentation does not describe,
// backstop.Wrap over a fallback.Store over Redis, is not refused; it must
// fail safe. Redis dies and the breaker opens; duplicates of each key race
// through the guard while it is out, and again once Redis is back empty.
// Under every policy each key is paid at most once (FailClosed: not at
// all while Redis is out), and a paid key answers its payment: Wrap marks
// the lease fallback hands out (a secondary's, or an unguarded one) in
// PostgreSQL, so even FailOpen's duplicates are kept apart and no effect
// runs twice.
func TestWrapOverFallback(t *testing.T) {
	t.Parallel()
	for _, policy := range []fallback.Policy{fallback.FailClosed, fallback.Secondary, fallback.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			wrapOverFallback(t, policy)
		})
	}
}

func wrapOverFallback(t *testing.T, policy fallback.Policy) {
	p := newPrimary(t)
	pg, db := pgStore(t)
	b := paymentsBackstop(t, db)
	opts := fallback.Options{Policy: policy, FailuresToOpen: 1, OpenTimeout: openFor, Timeout: 3 * time.Second,
		SecondaryTimeout: 5 * time.Second, Logger: quiet}
	if policy == fallback.Secondary {
		opts.Secondary = pg
	}
	fs := newStore(t, p.store, opts)
	g := guard.New(backstop.Wrap(fs, b), guard.Options{Lease: 5 * time.Second})
	pay, runs, _ := payOnce(t, b, 50*time.Millisecond)
	do := func(id string) error {
		deadline := time.Now().Add(20 * time.Second)
		for {
			res, err := g.Do(bg, guard.Key{Scope: "wo", ID: id}, "fp", pay)
			switch {
			case err == nil && string(res.Value) != "paid "+id:
				return fmt.Errorf("answer %q", res.Value)
			case err == nil:
				return nil
			case policy == fallback.FailClosed && isUnavailable(err):
				return err
			case !errors.Is(err, guard.ErrInProgress) && !isUnavailable(err) && !errors.Is(err, backstop.ErrStaleFence):
				return err
			case time.Now().After(deadline):
				return fmt.Errorf("still %w after 20s", err)
			}
			time.Sleep(20 * time.Millisecond) // a client's retry pause
		}
	}
	race := func(ids []string) {
		var wg sync.WaitGroup
		for _, id := range ids {
			for range 4 {
				wg.Go(func() {
					if err := do(id); err != nil && !(policy == fallback.FailClosed && isUnavailable(err)) {
						t.Errorf("%s: %v", id, err)
					}
				})
			}
		}
		wg.Wait()
	}
	before := []string{"a0", "a1", "a2"}
	race(before)
	p.srv.Kill()
	openBreaker(t, fs)
	during := []string{"b0", "b1", "b2", "b3", "b4", "b5"}
	race(append(during, before...))
	p.srv.Restart() // empty
	closeBreaker(t, fs, 10*time.Second)
	race(append(during, before...))
	rows, keys := pgenv.CountPayments(t, db)
	if rows != keys || keys != len(before)+len(during) {
		t.Errorf("payments: %d rows for %d keys; want one for each of %d", rows, keys, len(before)+len(during))
	}
	// No effect ran twice: not even FailOpen's duplicates, whose leases
	// Wrap marked.
	if n := runs.Load(); n != int64(keys) {
		t.Errorf("%d effects ran for %d keys", n, keys)
	}
}
