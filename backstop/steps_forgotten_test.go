package backstop_test

import (
	"context"
	"database/sql"
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

// forgetfulStore is a migrated database with a reservations table, a
// Backstop and a Postgres Store on it, and a guard on that store whose
// keys are forgotten half a second after they end.
func forgetfulStore(t *testing.T) (*sql.DB, *backstop.Backstop, *pgstore.Store, *guard.Guard) {
	db := pgenv.Migrated(t, pgstore.Options{})
	reservationsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	return db, b, s, guard.New(s, guard.Options{TTL: 500 * time.Millisecond})
}

// TestStepRowsForgottenWithTheirKey: a key whose retention passed starts
// afresh, and so do its steps: a request that reuses the key later (with
// another payload here) makes its own step's write and gets its own
// result, not the step result of the request the key was forgotten for
// (its charge would never be made). The key's row is forgotten on the
// Postgres Store after the guard's TTL (shorter than the backstop's, as
// Options.TTL asks), by Purge, and, under Wrap, the mark of a holder that
// committed its step after its lease ran out expires before that step's
// row would.
func TestStepRowsForgottenWithTheirKey(t *testing.T) {
	t.Parallel()
	step := func(b *backstop.Backstop, ran *atomic.Int64) guard.Func {
		return func(ctx context.Context, l guard.Lease) ([]byte, error) {
			return b.Step(ctx, l, "reserve", reserve(ran))
		}
	}
	t.Run("store", func(t *testing.T) {
		t.Parallel()
		db, b, _, g := forgetfulStore(t)
		for _, fails := range []bool{false, true} {
			key := newKey(t)
			var ran atomic.Int64
			_, err := g.Do(ctx, key, "first", func(ctx context.Context, l guard.Lease) ([]byte, error) {
				r, err := step(b, &ran)(ctx, l)
				if err == nil && fails {
					err = errors.New("a later step failed")
				}
				return r, err
			})
			if (err != nil) != fails {
				t.Fatal(err)
			}
			time.Sleep(600 * time.Millisecond) // the key's retention passes, on the database's clock
			res, err := g.Do(ctx, key, "second", step(b, &ran))
			if err != nil || string(res.Value) != "res-2@2" || reservations(t, db, key) != 2 {
				t.Fatalf("failed %t: the key's next request = %q, %v with %d reservations; want its own res-2@2, 2 reservations",
					fails, res.Value, err, reservations(t, db, key))
			}
		}
	})
	t.Run("purged", func(t *testing.T) {
		t.Parallel()
		db, b, s, g := forgetfulStore(t)
		key := newKey(t)
		var ran atomic.Int64
		if _, err := g.Do(ctx, key, "first", step(b, &ran)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond) // the key's retention passes, on the database's clock
		if _, err := s.Purge(ctx, pgstore.PurgeOptions{}); err != nil {
			t.Fatal(err)
		}
		res, err := g.Do(ctx, key, "second", step(b, &ran))
		if err != nil || string(res.Value) != "res-2@1" || reservations(t, db, key) != 2 {
			t.Fatalf("after Purge, the key's next request = %q, %v with %d reservations; want its own res-2@1, 2 reservations",
				res.Value, err, reservations(t, db, key))
		}
	})
	// The key's retention ends while a Purge runs: after the pass that
	// deletes the steps of expired keys, before the pass that deletes the
	// keys. The key's row must not go without its steps (they would meet
	// the key's next request): it waits for the next Purge.
	t.Run("expiring during purge", func(t *testing.T) {
		t.Parallel()
		db, b, s, g := forgetfulStore(t)
		var ran atomic.Int64
		expired := func(key guard.Key) func() bool {
			return func() bool {
				var gone bool
				err := db.QueryRowContext(ctx, `SELECT expires_at <= now() FROM idemguard_keys WHERE scope = $1 AND id = $2`,
					key.Scope, key.ID).Scan(&gone)
				return err == nil && gone
			}
		}
		// Another key, expired already, so that the steps pass deletes a
		// row and reports its progress.
		other := newKey(t)
		if _, err := g.Do(ctx, other, "first", step(b, &ran)); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the other key's retention to pass", expired(other))
		key := newKey(t)
		if _, err := g.Do(ctx, key, "first", step(b, &ran)); err != nil {
			t.Fatal(err)
		}
		waited := false
		if _, err := s.Purge(ctx, pgstore.PurgeOptions{Progress: func(table string, _ int64) {
			if table == "steps" && !waited {
				waited = true
				testenv.WaitFor(t, 10*time.Second, "the key's retention to pass", expired(key))
			}
		}}); err != nil {
			t.Fatal(err)
		}
		if !waited {
			t.Fatal("the steps pass reported no progress")
		}
		// The key's row stayed: its next claim takes the expired row over
		// (fence 2) and drops the forgotten steps with it.
		res, err := g.Do(ctx, key, "second", step(b, &ran))
		if err != nil || string(res.Value) != "res-3@2" || reservations(t, db, key) != 2 {
			t.Fatalf("after Purge, the key's next request = %q, %v with %d reservations; want its own res-3@2, 2 reservations",
				res.Value, err, reservations(t, db, key))
		}
	})
	// An unguarded attempt (fallback's fail-open: fence 0, no key row of
	// its own) commits its step after the key's row expired: that step is
	// this key's, not the forgotten one's, and neither Purge nor the
	// next claim drops it; the next attempt finds it instead of writing
	// again.
	t.Run("unguarded", func(t *testing.T) {
		t.Parallel()
		db, b, s, g := forgetfulStore(t)
		key := newKey(t)
		if _, err := g.Do(ctx, key, "first", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond) // the key's retention passes, on the database's clock
		var ran atomic.Int64
		open := guard.Lease{Key: key, Token: "fail-open"}
		commitReserve(t, db, b, open, &ran)
		if _, err := s.Purge(ctx, pgstore.PurgeOptions{BatchSize: 1}); err != nil {
			t.Fatal(err)
		}
		if _, _, ok, err := b.LookupStep(ctx, key, "reserve"); err != nil || !ok {
			t.Fatalf("the unguarded step after Purge: %t, %v", ok, err)
		}
		// A key row that expired again, then the next claim.
		pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, expires_at)
			VALUES ($1, $2, 'first', 'completed', 'old', 1, now() - interval '1 hour')`, key.Scope, key.ID)
		res, err := g.Do(ctx, key, "second", step(b, &ran))
		if err != nil || string(res.Value) != "res-1@0" || reservations(t, db, key) != 1 {
			t.Fatalf("the next attempt = %q, %v with %d reservations; want the unguarded step's res-1@0, 1 reservation",
				res.Value, err, reservations(t, db, key))
		}

		// The same under Wrap: the mark of the next claim keeps the step.
		key = newKey(t)
		pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, expires_at)
			VALUES ($1, $2, 'first', 'completed', 'old', 1, now() - interval '1 hour')`, key.Scope, key.ID)
		open.Key = key
		commitReserve(t, db, b, open, &ran)
		gw := guard.New(backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b), guard.Options{})
		res, err = gw.Do(ctx, key, "second", step(b, &ran))
		if err != nil || string(res.Value) != "res-3@0" || reservations(t, db, key) != 1 {
			t.Fatalf("under Wrap, the next attempt = %q, %v with %d reservations; want the unguarded step's res-3@0, 1 reservation",
				res.Value, err, reservations(t, db, key))
		}
	})
	t.Run("wrap", func(t *testing.T) {
		t.Parallel()
		opts := pgstore.Options{TTL: time.Second}
		db := pgenv.Migrated(t, opts)
		reservationsTable(t, db)
		b := mustBackstop(t, db, opts)
		rdb := testenv.Redis(t)
		rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
		w := backstop.Wrap(rs, b)
		key := newKey(t)
		out, err := w.Claim(ctx, guard.ClaimRequest{Key: key, Token: "paused", Fingerprint: "first",
			Lease: 200 * time.Millisecond, TTL: time.Second})
		if err != nil || out.Status != guard.Acquired {
			t.Fatal(out, err)
		}
		time.Sleep(700 * time.Millisecond) // the holder pauses past its lease, then commits its step
		var ran atomic.Int64
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := reserve(&ran)(ctx, tx, out.Lease); err != nil {
			t.Fatal(err)
		}
		if err := b.CommitStep(ctx, tx, out.Lease, "reserve", []byte("paused's")); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil { // Redis forgets
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond) // the mark's retention (lease + TTL) passes; the step's (from its commit) not yet
		g := guard.New(w, guard.Options{TTL: time.Second})
		res, err := g.Do(ctx, key, "second", step(b, &ran))
		if err != nil || string(res.Value) != "res-2@2" || reservations(t, db, key) != 2 {
			t.Fatalf("the key's next request = %q, %v with %d reservations; want its own res-2@2, 2 reservations",
				res.Value, err, reservations(t, db, key))
		}
	})
}

// TestStepOtherPayloadAfterRedisForgot: a holder commits a step's row and
// dies; Redis forgets the key. A request with another payload under the
// key is refused (the holder's mark keeps the first payload's
// fingerprint), while the dead holder's lease lasts and after it ended,
// and never gets the first payload's step result; the first payload's
// retry resumes from the step.
func TestStepOtherPayloadAfterRedisForgot(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	reservationsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	w := backstop.Wrap(rs, b)
	key := newKey(t)
	out, err := w.Claim(ctx, guard.ClaimRequest{Key: key, Token: "dies", Fingerprint: "first",
		Lease: 300 * time.Millisecond, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	var ran atomic.Int64
	commitReserve(t, db, b, out.Lease, &ran)
	g := guard.New(w, guard.Options{})
	fn := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		return b.Step(ctx, l, "reserve", reserve(&ran))
	}
	for _, wait := range []time.Duration{0, 400 * time.Millisecond} { // within the dead holder's lease, then after it
		time.Sleep(wait) // on the database's clock
		// Redis forgets.
		if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
			t.Fatal(err)
		}
		if res, err := g.Do(ctx, key, "second", fn); !errors.Is(err, guard.ErrMismatch) {
			t.Fatalf("after %s, another payload = %q, %v; want ErrMismatch", wait, res.Value, err)
		}
	}
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := g.Do(ctx, key, "first", fn)
	if err != nil || string(res.Value) != "res-1@1" || reservations(t, db, key) != 1 || ran.Load() != 2 {
		t.Fatalf("the first payload's retry = %q, %v, %d reservations, %d runs; want res-1@1, 1 reservation, 2 runs",
			res.Value, err, reservations(t, db, key), ran.Load())
	}
}

// TestStoreReleaseAfterCommittedStep: on the Postgres Store, a first
// attempt whose step committed its row (Backstop.CommitStep) but whose
// result never reached the key's record (the write failed) is released,
// as httpx releases a 5xx: the step's effect happened, so the release
// does not make the key as if never claimed, as Wrap's does not. A
// request with another payload is refused instead of finding the
// released payload's step; the same payload's retry resumes from it.
func TestStoreReleaseAfterCommittedStep(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	reservationsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	key := newKey(t)
	out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "first", Fingerprint: "first", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	var ran atomic.Int64
	commitReserve(t, db, b, out.Lease, &ran)
	if err := s.Release(ctx, out.Lease); err != nil {
		t.Fatal(err)
	}
	other, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "other", Fingerprint: "second", Lease: time.Minute, TTL: time.Hour})
	if err != nil || other.Status != guard.Mismatch {
		t.Fatalf("another payload after the release = %+v, %v; want Mismatch", other, err)
	}
	g := guard.New(s, guard.Options{})
	res, err := g.Do(ctx, key, "first", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		return b.Step(ctx, l, "reserve", reserve(&ran))
	})
	if err != nil || string(res.Value) != "res-1@1" || reservations(t, db, key) != 1 {
		t.Fatalf("the first payload's retry = %q, %v, %d reservations; want res-1@1, 1 reservation", res.Value, err, reservations(t, db, key))
	}
}
