package backstop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestLostRecordEndsMarkLease: Redis forgets a running holder's record
// (FLUSHALL, a failover that lost it); the holder's effect then fails, is
// released or panics, and primary answers its Fail or Release with
// ErrLeaseLost (Release, nil). The holder's token is still on its mark and it runs
// nothing any more: its lease on the mark must end there, or every retry
// of the key is told the key is in progress for the rest of a lease
// nobody holds (30 s by default; a minute here).
func TestLostRecordEndsMarkLease(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	s := backstop.Wrap(rs, b)
	g := guard.New(s, guard.Options{Lease: time.Minute})
	forget := func(k guard.Key) {
		t.Helper()
		if err := rdb.Del(ctx, rs.Name(k)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// ends runs a holder of a fresh key whose record Redis forgets while
	// it runs, ends it with end, and claims the key again.
	ends := func(t *testing.T, end func(k guard.Key, l guard.Lease) error) {
		t.Helper()
		k := newKey(t)
		a, err := g.Claim(ctx, k, "fp")
		if err != nil {
			t.Fatal(err)
		}
		forget(k)
		if err := end(k, a.Lease); err != nil && !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("the holder's end once Redis forgot = %v, want nil or ErrLeaseLost", err)
		}
		out, err := g.Claim(ctx, k, "fp")
		if err != nil || out.Status != guard.Acquired || out.Lease.Fence <= a.Lease.Fence {
			t.Fatalf("claim after the holder ended = %s (fence %d), %v; want acquired above fence %d at once",
				out.Status, out.Lease.Fence, err, a.Lease.Fence)
		}
	}
	t.Run("Fail", func(t *testing.T) {
		ends(t, func(_ guard.Key, l guard.Lease) error { return g.Fail(ctx, l, errors.New("declined")) })
	})
	t.Run("Release", func(t *testing.T) {
		ends(t, func(_ guard.Key, l guard.Lease) error { return g.Release(ctx, l) })
	})
	for _, kind := range []guard.WriteKind{guard.WriteFail, guard.WriteRelease} {
		t.Run("WriteBatch"+map[guard.WriteKind]string{guard.WriteFail: "Fail", guard.WriteRelease: "Release"}[kind], func(t *testing.T) {
			ends(t, func(_ guard.Key, l guard.Lease) error {
				return s.(guard.BatchStore).WriteBatch(ctx, []guard.Write{{Kind: kind, Lease: l, Reason: "declined", TTL: time.Hour}})[0]
			})
		})
	}
	// Do: the effect fails, or panics, after Redis forgot the key.
	t.Run("DoError", func(t *testing.T) {
		k := newKey(t)
		_, err := g.Do(ctx, k, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			forget(k)
			return nil, errors.New("declined")
		})
		if err == nil {
			t.Fatal("Do of a failing effect succeeded")
		}
		if out, err := g.Claim(ctx, k, "fp"); err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim after Do failed = %s, %v; want acquired at once", out.Status, err)
		}
	})
	t.Run("DoPanic", func(t *testing.T) {
		k := newKey(t)
		func() {
			defer func() { _ = recover() }()
			_, _ = g.Do(ctx, k, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				forget(k)
				panic("boom")
			})
		}()
		if out, err := g.Claim(ctx, k, "fp"); err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim after Do panicked = %s, %v; want acquired at once", out.Status, err)
		}
	})
	// DoBatch with mixed outcomes once Redis forgot every key: an error
	// and a panic end their leases; a success that committed its row is
	// replayed from it.
	t.Run("DoBatch", func(t *testing.T) {
		pgenv.PaymentsTable(t, db)
		items := []guard.BatchItem{{Key: newKey(t), Fingerprint: "fp"}, {Key: newKey(t), Fingerprint: "fp"}, {Key: newKey(t), Fingerprint: "fp"}}
		res := g.DoBatch(ctx, items, func(_ context.Context, i int, l guard.Lease) ([]byte, error) {
			forget(items[i].Key)
			switch i {
			case 0:
				return nil, errors.New("declined")
			case 1:
				panic("boom")
			}
			return []byte("paid"), pay(t, db, b, l, "paid")
		}, guard.BatchOptions{Concurrency: 3})
		if res[0].Err == nil || !errors.Is(res[1].Err, guard.ErrPanicked) {
			t.Fatalf("batch results = %v, %v; want the error and the panic", res[0].Err, res[1].Err)
		}
		for i, it := range items[:2] {
			if out, err := g.Claim(ctx, it.Key, "fp"); err != nil || out.Status != guard.Acquired {
				t.Errorf("claim of item %d after the batch = %s, %v; want acquired at once", i, out.Status, err)
			}
		}
		if out, err := g.Claim(ctx, items[2].Key, "fp"); err != nil || out.Status != guard.Replay || string(out.Result) != "paid" {
			t.Errorf("claim of the paid item after the batch = %s %q, %v; want its replay", out.Status, out.Result, err)
		}
	})
	// Hold and Wait: a duplicate waiting for a holder whose record Redis
	// forgot gets the key as soon as the holder fails, not when its lease
	// (a minute) would have ended.
	t.Run("HoldWait", func(t *testing.T) {
		k := newKey(t)
		_, held, err := g.Hold(ctx, k, "fp")
		if err != nil {
			t.Fatal(err)
		}
		forget(k)
		waited := make(chan error, 1)
		go func() {
			out, err := g.Wait(ctx, k, "fp", guard.WaitOptions{Timeout: 20 * time.Second})
			if err == nil && out.Status != guard.Acquired {
				err = errors.New("wait's outcome: " + out.Status.String())
			}
			waited <- err
		}()
		if err := held.Fail(errors.New("declined")); err != nil && !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("Held.Fail = %v", err)
		}
		if err := <-waited; err != nil {
			t.Fatalf("Wait after the holder failed = %v, want the key", err)
		}
	})
}

// TestUnreachableEndEndsMarkLease: Redis dies while a holder runs; the
// holder then fails or releases its claim, which Redis cannot take
// (ErrUnavailable, after the store's retries), and Redis comes back
// empty. The holder runs nothing any more: the next claim must not be
// told the key is in progress for the rest of a lease (a minute here)
// nobody holds.
func TestUnreachableEndEndsMarkLease(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"fail", "release"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartRedis(t)
			db := pgenv.Migrated(t, pgstore.Options{})
			b := mustBackstop(t, db, pgstore.Options{})
			rs := guard.NewRedisStore(srv.Client(), guard.RedisOptions{})
			g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: time.Minute})
			k := newKey(t)
			a, err := g.Claim(ctx, k, "fp")
			if err != nil {
				t.Fatal(err)
			}
			srv.Kill()
			switch end {
			case "fail":
				err = g.Fail(ctx, a.Lease, errors.New("declined"))
			case "release":
				err = g.Release(ctx, a.Lease)
			}
			if !errors.Is(err, guard.ErrUnavailable) {
				t.Fatalf("%s while Redis is down = %v, want ErrUnavailable", end, err)
			}
			srv.Restart() // empty
			var out guard.Outcome
			testenv.WaitFor(t, 10*time.Second, "a claim answered", func() bool {
				out, err = g.Claim(ctx, k, "fp")
				return !errors.Is(err, guard.ErrUnavailable) // the client redials
			})
			if err != nil || out.Status != guard.Acquired || out.Lease.Fence <= a.Lease.Fence {
				t.Fatalf("claim once Redis is back = %s (fence %d), %v; want acquired above fence %d", out.Status, out.Lease.Fence, err, a.Lease.Fence)
			}
		})
	}
}
