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

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
)

// TestSwitchOverBackstopRace: the fallback's primary is Redis wrapped by
// backstop.Wrap, its secondary a pgstore.Store on the same tables, and
// every effect commits its payment with the backstop (Backstop.Func).
// New keys keep arriving, each raced by four duplicates that retry while
// told in progress or unavailable, each effect taking 150 ms, while Redis
// is killed (claims go to the secondary) and comes back empty (claims
// return to Redis, checked against the secondary). Holders run across
// both switches: a Redis holder when Redis dies, a secondary holder when
// it returns. Every key must be paid once, and no effect of a key may
// start while another of the same key runs (the backstop's mark, or the
// secondary's row, keeps the holder's lease in the shared table).
func TestSwitchOverBackstopRace(t *testing.T) {
	t.Parallel()
	p := newPrimary(t)
	pg, db := pgStore(t)
	b := paymentsBackstop(t, db)
	sec := &acquisitions{Store: pg}
	s := newStore(t, backstop.Wrap(p.store, b), fallback.Options{
		Policy: fallback.Secondary, Secondary: sec,
		FailuresToOpen: 1, OpenTimeout: openFor, Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet,
	})
	g := guard.New(s, guard.Options{Lease: 5 * time.Second})

	fn, runs, overlaps := payOnce(t, b, 150*time.Millisecond)
	pay := func(id string) error {
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := g.Do(bg, guard.Key{Scope: "sb", ID: id}, "fp", fn)
			switch {
			case err == nil && string(res.Value) != "paid "+id:
				return fmt.Errorf("answer %q", res.Value)
			case err == nil:
				return nil
			case !errors.Is(err, guard.ErrInProgress) && !isUnavailable(err) && !errors.Is(err, guard.ErrLeaseLost) &&
				!errors.Is(err, backstop.ErrStaleFence):
				return err
			case time.Now().After(deadline):
				return fmt.Errorf("still %w after 30s", err)
			}
			time.Sleep(20 * time.Millisecond) // a client's retry pause
		}
	}

	const keys, dups = 90, 4
	var wg sync.WaitGroup
	// A Fatal below (a wait that runs out) while the payers run must not
	// end the test before them: a payer's Errorf after the end panicked
	// the whole test binary (load ~30), and every later test went unrun.
	t.Cleanup(wg.Wait)
	started := make(chan int, keys)
	go func() {
		defer close(started)
		for i := range keys {
			started <- i
			time.Sleep(40 * time.Millisecond) // the arrival rate of new keys
		}
	}()
	var arrived atomic.Int64
	wg.Go(func() {
		for i := range started {
			arrived.Store(int64(i + 1))
			for range dups {
				wg.Go(func() {
					if err := pay(fmt.Sprintf("k%d", i)); err != nil {
						t.Errorf("k%d: %v", i, err)
					}
				})
			}
		}
	})
	waitFor(t, 30*time.Second, "a third of the keys arrived", func() bool { return arrived.Load() >= keys/3 })
	p.srv.Kill()
	openBreaker(t, s)
	waitFor(t, 30*time.Second, "two thirds of the keys arrived", func() bool { return arrived.Load() >= 2*keys/3 })
	p.srv.Restart() // empty
	closeBreaker(t, s, 10*time.Second)
	wg.Wait()

	// Every key once more: a replay, nothing runs.
	before := runs.Load()
	for i := range keys {
		if err := pay(fmt.Sprintf("k%d", i)); err != nil {
			t.Errorf("k%d after the storm: %v", i, err)
		}
	}
	if n := runs.Load() - before; n != 0 {
		t.Errorf("%d effects ran for keys already paid", n)
	}
	rows, paid := pgenv.CountPayments(t, db)
	if rows != keys || paid != keys {
		t.Errorf("payments: %d rows for %d keys, want one for each of %d", rows, paid, keys)
	}
	if sec.n.Load() == 0 {
		t.Errorf("no key was acquired in the secondary: the outage did not happen")
	}
	t.Logf("%d keys × %d: %d effects run (rolled back beyond one per key: %d), %d acquired in the secondary, %d overlapping",
		keys, dups, runs.Load(), runs.Load()-int64(rows), sec.n.Load(), overlaps.Load())
}

// acquisitions counts the claims a store answered Acquired.
type acquisitions struct {
	guard.Store
	n atomic.Int64
}

func (a *acquisitions) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	out, err := a.Store.Claim(ctx, req)
	if err == nil && out.Status == guard.Acquired {
		a.n.Add(1)
	}
	return out, err
}

// payOnce is a backstop Func that inserts its key's payments row and then
// waits work (the payment provider's answer: the workload, not
// synchronisation). It counts its runs, and fails t, counting it, when an
// effect starts while another of the same key runs.
func payOnce(t *testing.T, b *backstop.Backstop, work time.Duration) (fn guard.Func, runs, overlaps *atomic.Int64) {
	var inflight sync.Map // key ID -> *atomic.Int64
	runs, overlaps = new(atomic.Int64), new(atomic.Int64)
	fn = b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		n, _ := inflight.LoadOrStore(l.Key.ID, new(atomic.Int64))
		if n.(*atomic.Int64).Add(1) > 1 {
			overlaps.Add(1)
			t.Errorf("%s: an effect started while another of the key ran (fence %d)", l.Key.ID, l.Fence)
		}
		defer n.(*atomic.Int64).Add(-1)
		runs.Add(1)
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.ID, l.Fence); err != nil {
			return nil, err
		}
		time.Sleep(work)
		return []byte("paid " + l.Key.ID), nil
	})
	return fn, runs, overlaps
}
