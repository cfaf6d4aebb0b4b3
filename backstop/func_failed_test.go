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

// order is a business effect with a natural unique row: the order of the
// key (primary key). Run again after the first run committed, its INSERT
// fails with a unique violation (23505) before the backstop's row is
// written.
func order(ran *atomic.Int64) backstop.TxFunc {
	return func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		ran.Add(1)
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (key) VALUES ($1)`, l.Key.String()); err != nil {
			return nil, err
		}
		return []byte("order by " + l.Token), nil
	}
}

// TestFuncReplaysWhenEffectAlreadyMade: Redis forgot a key whose effect
// committed, and the retry's effect fails because its business row exists
// (the table's own unique constraint). Func answers the retry with the
// stored result, as it does when its Commit finds the row: the effect
// failing is how it learns the effect was made. So does the duplicate
// whose insert waited for the first transaction's and failed once that
// committed. fn's error stays the answer for another fingerprint's
// request, and for a key no row was committed for. Func returned the
// unique violation (23505) to the retry, which got an error where the
// original response was promised.
func TestFuncReplaysWhenEffectAlreadyMade(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.Exec(t, db, `CREATE TABLE orders (key text PRIMARY KEY)`)
	b := mustBackstop(t, db, pgstore.Options{})
	var ran atomic.Int64

	t.Run("retry after Redis forgot", func(t *testing.T) {
		key := newKey(t)
		if r, err := b.Func("fp", order(&ran))(ctx, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}); err != nil || string(r) != "order by A" {
			t.Fatalf("first Func = %q, %v", r, err)
		}
		r, err := b.Func("fp", order(&ran))(ctx, guard.Lease{Key: key, Token: "B", Fence: 1, Attempt: 1})
		if err != nil || string(r) != "order by A" {
			t.Fatalf("retry whose effect failed on the committed order = %q, %v; want the stored %q", r, err, "order by A")
		}
		// Another payload under the key is not told the stored result.
		if r, err := b.Func("other-fp", order(&ran))(ctx, guard.Lease{Key: key, Token: "C", Fence: 2, Attempt: 2}); err == nil || r != nil {
			t.Fatalf("another fingerprint's Func = %q, %v; want its effect's error", r, err)
		}
	})

	t.Run("duplicate waiting for the first", func(t *testing.T) {
		key := newKey(t)
		release := make(chan struct{})
		first := make(chan error, 1)
		var holder int
		locked := make(chan struct{})
		go func() {
			_, err := b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
				r, err := order(&ran)(ctx, tx, l)
				if err == nil {
					err = tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&holder)
				}
				close(locked)
				<-release
				return r, err
			})(ctx, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1})
			first <- err
		}()
		<-locked
		second := make(chan error, 1)
		var got []byte
		go func() {
			var err error
			got, err = b.Func("fp", order(&ran))(ctx, guard.Lease{Key: key, Token: "B", Fence: 1, Attempt: 1})
			second <- err
		}()
		testenv.WaitFor(t, 30*time.Second, "the duplicate's insert to wait for the first's", func() bool {
			var n int
			_ = db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&n)
			return n > 0
		})
		close(release)
		if err := <-first; err != nil {
			t.Fatalf("first Func: %v", err)
		}
		if err := <-second; err != nil || string(got) != "order by A" {
			t.Fatalf("duplicate = %q, %v; want the stored %q", got, err, "order by A")
		}
	})

	t.Run("nothing committed", func(t *testing.T) {
		key := newKey(t)
		pgenv.Exec(t, db, `INSERT INTO orders (key) VALUES ($1)`, key.String()) // made outside the guard
		if r, err := b.Func("fp", order(&ran))(ctx, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}); err == nil || r != nil {
			t.Fatalf("Func whose effect failed, no row committed = %q, %v; want the effect's error", r, err)
		}
	})
}

// TestStepReplaysWhenEffectAlreadyMade: a backstopped step committed its
// reservation, Redis forgot the key and its steps, and the retry's step
// fails on the reservation's unique row. Step answers with the committed
// step's result (the second attempt goes on with it) instead of the
// unique violation.
func TestStepReplaysWhenEffectAlreadyMade(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.Exec(t, db, `CREATE TABLE orders (key text PRIMARY KEY)`)
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(rs, guard.Options{})
	key := newKey(t)
	var ran atomic.Int64
	attempt := 0
	fn := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		attempt++
		r, err := b.Step(ctx, l, "order", order(&ran))
		if err != nil {
			return nil, err
		}
		if attempt == 1 {
			return nil, errors.New("payment provider down")
		}
		return append([]byte("paid "), r...), nil
	}
	if _, err := g.Do(ctx, key, "fp", fn); err == nil {
		t.Fatal("first attempt succeeded")
	}
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil { // Redis forgets the key and its step
		t.Fatal(err)
	}
	res, err := g.Do(ctx, key, "fp", fn)
	if err != nil {
		t.Fatalf("second attempt: %v; want the committed step's result", err)
	}
	if ran.Load() != 2 || string(res.Value) != "paid order by "+tokenOf(t, b, key) {
		t.Fatalf("second attempt = %q after %d runs of the step", res.Value, ran.Load())
	}
}

// tokenOf is the token the step "order" of key was committed with (the
// first attempt's, recorded in the step's result).
func tokenOf(t testing.TB, b *backstop.Backstop, key guard.Key) string {
	t.Helper()
	r, _, found, err := b.LookupStep(ctx, key, "order")
	if err != nil || !found {
		t.Fatalf("LookupStep = %v, %v", found, err)
	}
	return string(r)[len("order by "):]
}
