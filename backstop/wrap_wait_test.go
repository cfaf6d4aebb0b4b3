package backstop_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// countingPrimary wraps the real Redis store and counts the claims and
// reads that reach it: each claim through Wrap is a Redis claim, a mark
// attempt in PostgreSQL (and its read) and, refused, a Redis release.
type countingPrimary struct {
	guard.Store
	claims, gets atomic.Int64
}

func (c *countingPrimary) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	c.gets.Add(1)
	return c.Store.Get(ctx, key)
}

func (c *countingPrimary) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, req)
}

// guard.Wait over Wrap while a holder's mark holds the key and Redis has
// lost its record: Get reports the mark's live lease (a pending record),
// so Wait only reads while it lasts, as it does for a key Redis holds,
// instead of claiming through Redis and PostgreSQL every 100 ms; and it
// still ends as soon as the holder commits (a Replay of its result) or
// fails (the key, Acquired), or when the mark's lease runs out (the key).
func TestWaitOverMarkReadsWhileLeaseLives(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	cp := &countingPrimary{Store: rs}
	store := backstop.Wrap(cp, b)
	const lease = 30 * time.Second // far beyond every wait below but the last
	g := guard.New(store, guard.Options{Lease: lease})
	// held claims a key through the wrapped store and makes Redis forget
	// its record: only the holder's mark in PostgreSQL holds it.
	held := func(g *guard.Guard) guard.Lease {
		t.Helper()
		k := newKey(t)
		out, err := g.Claim(ctx, k, "fp")
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim: %+v, %v", out, err)
		}
		if err := rdb.Del(ctx, rs.Name(k)).Err(); err != nil {
			t.Fatal(err)
		}
		return out.Lease
	}
	type waited struct {
		out guard.Outcome
		err error
	}
	wait := func(g *guard.Guard, k guard.Key, timeout time.Duration) <-chan waited {
		ch := make(chan waited, 1)
		go func() {
			out, err := g.Wait(ctx, k, "fp", guard.WaitOptions{Timeout: timeout})
			ch <- waited{out, err}
		}()
		return ch
	}
	// waiting starts a Wait and returns once it has looked at the key
	// twice, so the holder's next move comes while it waits.
	waiting := func(g *guard.Guard, k guard.Key) <-chan waited {
		before := cp.gets.Load()
		ch := wait(g, k, lease)
		testenv.WaitFor(t, 10*time.Second, "Wait looking at the key", func() bool { return cp.gets.Load() >= before+2 })
		return ch
	}

	t.Run("timeout", func(t *testing.T) {
		l := held(g)
		if rec, err := store.Get(ctx, l.Key); err != nil || rec.State != guard.StatePending ||
			rec.LeaseLeft <= 0 || rec.LeaseLeft > lease {
			t.Errorf("Get of a key only a live mark holds: %+v, %v; want pending with its lease left", rec, err)
		}
		before := cp.claims.Load()
		const timeout = 1500 * time.Millisecond
		w := <-wait(g, l.Key, timeout)
		var ip *guard.InProgressError
		if !errors.As(w.err, &ip) || ip.RetryAfter <= 0 || ip.RetryAfter > lease {
			t.Fatalf("Wait = %+v, %v; want *InProgressError with the mark's lease left", w.out, w.err)
		}
		// Claiming every 100 ms, it made about 15.
		if n := cp.claims.Load() - before; n != 0 {
			t.Errorf("Wait made %d claims in %s while the mark's lease lived, want none", n, timeout)
		}
	})

	t.Run("holder commits", func(t *testing.T) {
		l := held(g)
		start := time.Now()
		ch := waiting(g, l.Key)
		if err := pay(t, db, b, l, "receipt"); err != nil {
			t.Fatal(err)
		}
		w := <-ch
		if w.err != nil || w.out.Status != guard.Replay || string(w.out.Result) != "receipt" {
			t.Fatalf("Wait = %+v, %v; want a Replay of the holder's receipt", w.out, w.err)
		}
		if d := time.Since(start); d > lease/2 {
			t.Errorf("Wait took %s to see the commit, lease %s", d, lease)
		}
	})

	t.Run("holder fails", func(t *testing.T) {
		l := held(g)
		start := time.Now()
		ch := waiting(g, l.Key)
		// Redis lost the holder's record (ErrLeaseLost); its mark's lease ends.
		if err := g.Fail(ctx, l, errors.New("declined")); err != nil && !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatal(err)
		}
		w := <-ch
		if w.err != nil || w.out.Status != guard.Acquired {
			t.Fatalf("Wait = %+v, %v; want the key", w.out, w.err)
		}
		if d := time.Since(start); d > lease/2 {
			t.Errorf("Wait took %s to see the failure, lease %s", d, lease)
		}
		_ = g.Release(ctx, w.out.Lease)
	})

	t.Run("lease runs out", func(t *testing.T) {
		const short = 1500 * time.Millisecond
		gs := guard.New(store, guard.Options{Lease: short})
		l := held(gs)
		before := cp.claims.Load()
		w := <-wait(gs, l.Key, 20*short)
		if w.err != nil || w.out.Status != guard.Acquired {
			t.Fatalf("Wait = %+v, %v; want the key once the mark's lease ran out", w.out, w.err)
		}
		// One claim when the lease has run out (two if the first came a
		// moment before PostgreSQL's clock saw it end).
		if n := cp.claims.Load() - before; n > 2 {
			t.Errorf("Wait made %d claims over a mark's lease of %s, want 1", n, short)
		}
		_ = gs.Release(ctx, w.out.Lease)
	})
}
