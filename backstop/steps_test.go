package backstop_test

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
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

func reservationsTable(t testing.TB, db *sql.DB) {
	t.Helper()
	pgenv.Exec(t, db, `CREATE TABLE reservations (n bigint GENERATED ALWAYS AS IDENTITY, key text NOT NULL, fence bigint NOT NULL)`)
}

func reservations(t testing.TB, db *sql.DB, key guard.Key) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM reservations WHERE key = $1`, key.String()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// reserve is a step's business write: a reservation row (no unique
// constraint: only the step's row keeps it single).
func reserve(ran *atomic.Int64) backstop.TxFunc {
	return func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		n := ran.Add(1)
		if _, err := tx.ExecContext(ctx, `INSERT INTO reservations (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence); err != nil {
			return nil, err
		}
		return fmt.Appendf(nil, "res-%d@%d", n, l.Fence), nil
	}
}

// commitReserve makes the reserve step's effect and commits its row in
// one transaction, as a holder that dies right after would have.
func commitReserve(t testing.TB, db *sql.DB, b *backstop.Backstop, l guard.Lease, ran *atomic.Int64) {
	t.Helper()
	if err := tryReserve(t, db, b, l, ran); err != nil {
		t.Fatal(err)
	}
}

// tryReserve is commitReserve that returns CommitStep's refusal, or the
// commit's error, having rolled the transaction back.
func tryReserve(t testing.TB, db *sql.DB, b *backstop.Backstop, l guard.Lease, ran *atomic.Int64) error {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	r, err := reserve(ran)(ctx, tx, l)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CommitStep(ctx, tx, l, "reserve", r); err != nil {
		return err
	}
	return tx.Commit()
}

// TestCommitStep: a step's row is committed with its effect once; a
// second commit of the same step gets the first result and rolls back;
// a holder the backstop knows to be stale cannot commit it; bad input is
// refused.
func TestCommitStep(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	reservationsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	key := newKey(t)
	commit := func(l guard.Lease, name, result string) error {
		t.Helper()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, `INSERT INTO reservations (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence); err != nil {
			t.Fatal(err)
		}
		if err := b.CommitStep(ctx, tx, l, name, []byte(result)); err != nil {
			return err
		}
		return tx.Commit()
	}
	a := guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}
	if err := commit(a, "reserve", "r-A"); err != nil {
		t.Fatalf("first commit: %v", err)
	}
	bl := guard.Lease{Key: key, Token: "B", Fence: 2, Attempt: 2}
	err := commit(bl, "reserve", "r-B")
	var ace *backstop.AlreadyCommittedError
	if !errors.As(err, &ace) || string(ace.Result) != "r-A" || ace.Fence != 1 {
		t.Fatalf("second commit = %v, want AlreadyCommitted with r-A at fence 1", err)
	}
	if n := reservations(t, db, key); n != 1 {
		t.Fatalf("%d reservations, want 1", n)
	}
	if err := commit(bl, "charge", "c-B"); err != nil {
		t.Fatalf("another step: %v", err)
	}
	if r, f, ok, err := b.LookupStep(ctx, key, "reserve"); err != nil || !ok || string(r) != "r-A" || f != 1 {
		t.Fatalf("LookupStep = %q, %d, %t, %v", r, f, ok, err)
	}
	if _, _, ok, err := b.LookupStep(ctx, key, "ship"); err != nil || ok {
		t.Fatalf("LookupStep of an uncommitted step = %t, %v", ok, err)
	}

	// A holder the backstop knows is stale: a mark (Wrap, the pgstore Store)
	// with a higher fence.
	k2 := newKey(t)
	s := pgenv.Store(t, db, pgstore.Options{})
	if _, err := s.Claim(ctx, guard.ClaimRequest{Key: k2, Token: "OLD", Fingerprint: "fp", Lease: 50 * time.Millisecond, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // waiting for OLD's lease to run out on the database's clock
	nb, err := s.Claim(ctx, guard.ClaimRequest{Key: k2, Token: "NEW", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || nb.Status != guard.Acquired || nb.Lease.Fence != 2 {
		t.Fatal(nb, err)
	}
	err = commit(guard.Lease{Key: k2, Token: "OLD", Fence: 1, Attempt: 1}, "reserve", "old")
	if !errors.Is(err, backstop.ErrStaleFence) {
		t.Fatalf("stale holder's step = %v, want ErrStaleFence", err)
	}
	if err := commit(nb.Lease, "reserve", "new"); err != nil {
		t.Fatalf("the holder's step: %v", err)
	}
	if n := reservations(t, db, k2); n != 1 {
		t.Fatalf("%d reservations for %s, want 1 (the stale one rolled back)", n, k2)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	for name, err := range map[string]error{
		"nil tx":         b.CommitStep(ctx, nil, a, "x", nil),
		"empty name":     b.CommitStep(ctx, tx, a, "", nil),
		"no token":       b.CommitStep(ctx, tx, guard.Lease{Key: key, Fence: 1}, "x", nil),
		"negative fence": b.CommitStep(ctx, tx, guard.Lease{Key: key, Token: "A", Fence: -1}, "x", nil),
		"invalid key":    b.CommitStep(ctx, tx, guard.Lease{Key: guard.Key{Scope: "s"}, Token: "A", Fence: 1}, "x", nil),
		"name too long":  b.CommitStep(ctx, tx, a, string(make([]byte, guard.MaxStepNameLen+1)), nil),
		"control in key": b.CommitStep(ctx, tx, guard.Lease{Key: guard.Key{Scope: "s", ID: "a\nb"}, Token: "A", Fence: 1}, "x", nil),
	} {
		if err == nil {
			t.Errorf("%s: CommitStep succeeded", name)
		}
	}
}

// TestStepWhenRedisForgot: a checkout's reservation step commits its row
// with its effect; the attempt then fails, and Redis forgets the key (and
// its steps) before the retry. The retry's step runs its transaction
// again, finds the row, rolls back and returns the first result: one
// reservation. The order is committed once too, with Backstop.Func.
func TestStepWhenRedisForgot(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	reservationsTable(t, db)
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{})
	key := newKey(t)
	var ran atomic.Int64
	attempt := 0
	fn := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		attempt++
		r, err := b.Step(ctx, l, "reserve", reserve(&ran))
		if err != nil {
			return nil, err
		}
		if attempt == 1 {
			return nil, errors.New("payment provider down")
		}
		return b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence)
			return append([]byte("order for "), r...), err
		})(ctx, l)
	}
	if _, err := g.Do(ctx, key, "fp", fn); err == nil {
		t.Fatal("first attempt succeeded")
	}
	if rec, err := rs.Get(ctx, key); err != nil || len(rec.Steps) != 1 {
		t.Fatalf("Redis after attempt 1: %+v, %v; want the step", rec, err)
	}
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil { // Redis forgets
		t.Fatal(err)
	}
	res, err := g.Do(ctx, key, "fp", fn)
	if err != nil {
		t.Fatal(err)
	}
	if ran.Load() != 2 || reservations(t, db, key) != 1 {
		t.Fatalf("the reservation ran %d times, %d rows; want 2 runs (the second rolled back), 1 row", ran.Load(), reservations(t, db, key))
	}
	if want := "order for res-1@1"; string(res.Value) != want {
		t.Fatalf("result %q, want %q: the first attempt's committed reservation", res.Value, want)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("%d orders, want 1", rows)
	}
	// And a third Do replays.
	if res, err := g.Do(ctx, key, "fp", fn); err != nil || !res.Replayed {
		t.Fatalf("third Do = %+v, %v", res, err)
	}
}

// TestStepsRaceWithBackstop: 100 keys, 6 concurrent Do calls each through
// Wrap, whose effect reserves in a backstopped step and then fails half
// the time: one reservation per key, and every key's result names it.
func TestStepsRaceWithBackstop(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	reservationsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: 10 * time.Second})
	const keys, dups = 100, 6
	var ran atomic.Int64
	var failures atomic.Int64
	fn := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		r, err := b.Step(ctx, l, "reserve", reserve(&ran))
		if err != nil {
			return nil, err
		}
		if l.Attempt == 1 && failures.Add(1)%2 == 0 {
			return nil, errTransient
		}
		return r, nil
	}
	var (
		wg        sync.WaitGroup
		unclaimed atomic.Int64 // the storm's calls that got neither an answer nor ErrInProgress
		firstErr  sync.Once
	)
	for i := range keys {
		for range dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := g.Do(ctx, guard.Key{Scope: "race", ID: fmt.Sprint(i)}, "fp", fn)
				if err != nil && !errors.Is(err, guard.ErrInProgress) && !errors.Is(err, errTransient) {
					unclaimed.Add(1)
					firstErr.Do(func() { t.Logf("race/%d in the storm: %v", i, err) })
				}
			}()
		}
	}
	wg.Wait()
	t.Logf("%d of the storm's calls got another error", unclaimed.Load())
	for i := range keys {
		k := guard.Key{Scope: "race", ID: fmt.Sprint(i)}
		var res guard.Result
		var err error
		for range 100 {
			// A key whose storm calls all failed to claim it (-race
			// -count=2 at load ~30: race/6) gets its first attempt here,
			// and the effect fails half its first attempts on purpose:
			// the next attempt finds the step's committed row.
			if res, err = g.Do(ctx, k, "fp", fn); !errors.Is(err, guard.ErrInProgress) && !errors.Is(err, errTransient) {
				break
			}
			time.Sleep(20 * time.Millisecond) // a duplicate still holds the key
		}
		if err != nil || reservations(t, db, k) != 1 {
			t.Fatalf("%s: %+v, %v, %d reservations; want 1", k, res, err, reservations(t, db, k))
		}
	}
	if ran.Load() != keys {
		t.Fatalf("the reservation ran %d times for %d keys: a stored step ran again", ran.Load(), keys)
	}
}

// errTransient is the failure TestStepsRaceWithBackstop's effect makes
// half its first attempts end with.
var errTransient = errors.New("transient")

// TestStoreCommitClearsSteps: on the Postgres Store, Backstop.Commit in
// the business transaction completes the key's record and drops its
// steps, as Complete does.
func TestStoreCommitClearsSteps(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	s := pgenv.Store(t, db, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	g := guard.New(s, guard.Options{})
	key := newKey(t)
	res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		if _, err := guard.Step(ctx, l, "a", func(context.Context) (string, error) { return "1", nil }); err != nil {
			return nil, err
		}
		if rec, err := s.Get(ctx, key); err != nil || len(rec.Steps) != 1 {
			t.Errorf("record during the effect: %+v, %v", rec, err)
		}
		return b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence)
			return []byte("done"), err
		})(ctx, l)
	})
	if err != nil || string(res.Value) != "done" {
		t.Fatal(res, err)
	}
	var steps []byte
	var count int
	if err := db.QueryRowContext(ctx, `SELECT steps, step_count FROM idemguard_keys WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&steps, &count); err != nil {
		t.Fatal(err)
	}
	if steps != nil || count != 0 {
		t.Fatalf("completed row keeps steps %q (%d)", steps, count)
	}
}
