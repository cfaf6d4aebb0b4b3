package fallback_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
)

// TestSwitchBackToOlderPrimary: the recommended composition (fallback
// over backstop.Wrap on Redis, pgstore's Store on the same tables as the
// secondary). Before the outage Redis holds every key unfinished: failed
// once (a retry may run it again) or claimed by a holder that died. Redis
// dies, and during the outage every key is paid through the secondary.
// Redis then comes back with its old data (restarted from its append-only
// file): its records are older than the secondary's. Duplicates of every
// key race through this Store (switch-back checks on) and through a Store
// of a process that never saw the outage (no checks): none may run the
// effect again through Redis, every one answers the payment made during
// the outage, and each key is paid once. So in the other order
// (backstop.Wrap over the fallback.Store).
func TestSwitchBackToOlderPrimary(t *testing.T) {
	t.Parallel()
	for _, wrapOver := range []bool{false, true} {
		t.Run(map[bool]string{false: "fallback-over-wrap", true: "wrap-over-fallback"}[wrapOver], func(t *testing.T) {
			t.Parallel()
			switchBackToOlderPrimary(t, wrapOver)
		})
	}
}

func switchBackToOlderPrimary(t *testing.T, wrapOver bool) {
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialerRetries: 1, PoolSize: 64})
	t.Cleanup(func() { _ = c.Close() })
	rs := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t)})
	pg, db := pgStore(t)
	b := paymentsBackstop(t, db)
	opts := fallback.Options{Policy: fallback.Secondary, Secondary: pg, FailuresToOpen: 1, OpenTimeout: openFor,
		Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet}
	// compose is the guard's store: the fallback over Wrap, or Wrap
	// over the fallback; fs is the fallback.Store in it.
	compose := func() (st guard.Store, fs *fallback.Store) {
		if wrapOver {
			fs = newStore(t, rs, opts)
			return backstop.Wrap(fs, b), fs
		}
		fs = newStore(t, backstop.Wrap(rs, b), opts)
		return fs, fs
	}
	st, s := compose()
	// Long enough for the claims before the outage (Redis fsyncing every
	// write, then PostgreSQL) to be answered before the guard's deadline
	// on a loaded machine; the waits for the dead holders' leases poll.
	const lease = time.Second
	g := guard.New(st, guard.Options{Lease: lease})

	var runs atomic.Int64
	pay := func(what string) guard.Func {
		return b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			runs.Add(1)
			if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.ID, l.Fence); err != nil {
				return nil, err
			}
			return []byte(what + " " + l.Key.ID), nil
		})
	}
	const keys = 24
	k := func(i int) guard.Key { return guard.Key{Scope: "older", ID: fmt.Sprintf("k%d", i)} }
	// Before the outage, each key's attempt must reach Redis: a claim
	// the guard gave up on (unavailable on a loaded machine) is asked
	// again, once its lease is over if it was taken unheard. Any error
	// once passed for "failed once", and a key whose claim never reached
	// Redis then had no record there to come back with.
	declined := errors.New("declined")
	attempt := func(i int) error {
		if i%2 == 0 {
			switch _, err := g.Do(bg, k(i), "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, declined }); {
			case errors.Is(err, declined):
				return nil
			case err == nil:
				return errors.New("the failing effect succeeded")
			default:
				return err
			}
		}
		out, err := g.Claim(bg, k(i), "fp") // its holder dies
		switch {
		case err != nil:
			return err
		case out.Status == guard.InProgress:
			return guard.ErrInProgress
		case out.Status != guard.Acquired:
			return fmt.Errorf("claim: %s", out.Status)
		}
		return nil
	}
	for i := range keys {
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := attempt(i)
			if err == nil {
				break
			}
			if !(errors.Is(err, guard.ErrInProgress) || isUnavailable(err)) || time.Now().After(deadline) {
				t.Fatalf("k%d before the outage: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond) // a client's retry pause
		}
	}
	srv.Kill()
	openBreaker(t, s)

	// During the outage every key is paid in the secondary (once the dead
	// holders' leases ran out).
	do := func(g *guard.Guard, i int, fn guard.Func) (guard.Result, error) {
		deadline := time.Now().Add(20 * time.Second)
		for {
			res, err := g.Do(bg, k(i), "fp", fn)
			if (errors.Is(err, guard.ErrInProgress) || isUnavailable(err)) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond) // a client's retry pause
				continue
			}
			return res, err
		}
	}
	for i := range keys {
		if res, err := do(g, i, pay("outage")); err != nil || string(res.Value) != "outage "+k(i).ID {
			t.Fatalf("k%d during the outage: %q, %v", i, res.Value, err)
		}
	}
	paidInOutage := runs.Load()

	srv.Restart() // with the data it had before the outage
	// go-redis's pool, once as many dials failed as it holds connections,
	// answers the last dial error without dialling until a probe of its
	// own, once a second, gets through: wait for that, as a client would.
	waitFor(t, 10*time.Second, "the primary's client dialling again", func() bool { return c.Ping(bg).Err() == nil })
	for i := range keys {
		rec, err := rs.Get(bg, k(i))
		if err != nil || rec.State == guard.StateCompleted {
			t.Fatalf("k%d: Redis came back with %s, %v; want its record from before the outage", i, rec.State, err)
		}
	}
	closeBreaker(t, s, 10*time.Second)
	ost, _ := compose()
	// No dead holder's lease is waited out from here on, but each claim
	// must fit in its bound (Lease − margin) a Redis write fsync'd before
	// its reply and the backstop's check of the committed row (a row lock,
	// so a WAL flush). Once that takes longer for a key (a loaded
	// machine), every claim of it is cut and undone, and the duplicates
	// are told "in progress" by each one's Redis lease until do gives up.
	const afterLease = 5 * time.Second
	g = guard.New(st, guard.Options{Lease: afterLease})
	other := guard.New(ost, guard.Options{Lease: afterLease})

	var wg sync.WaitGroup
	for i := range keys {
		for _, g := range []*guard.Guard{g, other, g, other} {
			wg.Go(func() {
				res, err := do(g, i, pay("again"))
				if err != nil || string(res.Value) != "outage "+k(i).ID {
					t.Errorf("k%d after Redis came back: %q, %v; want the outage's payment", i, res.Value, err)
				}
			})
		}
	}
	wg.Wait()
	if n := runs.Load() - paidInOutage; n != 0 {
		t.Errorf("%d effects ran again for keys paid during the outage", n)
	}
	if rows, paid := pgenv.CountPayments(t, db); rows != keys || paid != keys {
		t.Errorf("payments: %d rows for %d keys, want one for each of %d", rows, paid, keys)
	}
}
