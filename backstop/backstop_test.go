package backstop_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

func newKey(t testing.TB) guard.Key {
	return guard.Key{Scope: "payments", ID: t.Name() + "-" + rand.Text()[:8]}
}

// pay makes the business effect and commits the key's row in one
// transaction. It returns Commit's error after rolling back if Commit
// refused.
func pay(t testing.TB, db *sql.DB, b *backstop.Backstop, l guard.Lease, result string) error {
	t.Helper()
	return payWith(t, db, l, func(tx *sql.Tx) error { return b.Commit(ctx, tx, l, "fp", []byte(result)) })
}

// payWith inserts a payment for l's key and commits it with what commit
// writes in the same transaction (rolled back when commit fails).
func payWith(t testing.TB, db *sql.DB, l guard.Lease, commit func(*sql.Tx) error) error {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence); err != nil {
		t.Fatal(err)
	}
	if err := commit(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return nil
}

func TestCommitOnceThenAlreadyCommitted(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	key := newKey(t)
	l1 := guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}
	if err := pay(t, db, b, l1, "receipt"); err != nil {
		t.Fatalf("first Commit: %v", err)
	}
	l2 := guard.Lease{Key: key, Token: "B", Fence: 2, Attempt: 2}
	err := pay(t, db, b, l2, "other")
	var ace *backstop.AlreadyCommittedError
	if !errors.As(err, &ace) || !errors.Is(err, backstop.ErrAlreadyCommitted) {
		t.Fatalf("second Commit = %v, want AlreadyCommittedError", err)
	}
	if string(ace.Result) != "receipt" || ace.Fence != 1 || ace.Key != key {
		t.Fatalf("AlreadyCommittedError = %+v", ace)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("payments = %d, want 1", rows)
	}
	res, fence, found, err := b.Lookup(ctx, key)
	if err != nil || !found || string(res) != "receipt" || fence != 1 {
		t.Fatalf("Lookup = %q, %d, %v, %v", res, fence, found, err)
	}
	if _, _, found, err := b.Lookup(ctx, newKey(t)); found || err != nil {
		t.Fatalf("Lookup of an unknown key = %v, %v", found, err)
	}

	// Another fingerprint never sees the stored result.
	tx, _ := db.BeginTx(ctx, nil)
	defer tx.Rollback()
	err = b.Commit(ctx, tx, l2, "other-fp", []byte("x"))
	if !errors.Is(err, guard.ErrMismatch) || errors.As(err, &ace) {
		t.Fatalf("Commit with another fingerprint = %v, want ErrMismatch", err)
	}
}

// TestCommitConcurrent: 32 transactions commit one key at once, each with
// its own business row; exactly one business row survives.
func TestCommitConcurrent(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	key := newKey(t)
	var won, already atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l := guard.Lease{Key: key, Token: fmt.Sprint("T", i), Fence: 1, Attempt: 1}
			err := pay(t, db, b, l, fmt.Sprint("r", i))
			switch {
			case err == nil:
				won.Add(1)
			case errors.Is(err, backstop.ErrAlreadyCommitted):
				already.Add(1)
			default:
				t.Errorf("Commit: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if rows, _ := pgenv.CountPayments(t, db); won.Load() != 1 || already.Load() != 31 || rows != 1 {
		t.Fatalf("won %d, already committed %d, payments %d; want 1, 31, 1", won.Load(), already.Load(), rows)
	}
}

func TestCommitBadInput(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	good := guard.Lease{Key: newKey(t), Token: "A", Fence: 1, Attempt: 1}
	for name, l := range map[string]guard.Lease{
		"empty key": {Token: "A", Fence: 1},
		"no token":  {Key: good.Key, Fence: 1},
		"fence -1":  {Key: good.Key, Token: "A", Fence: -1},
	} {
		if err := b.Commit(ctx, tx, l, "fp", nil); err == nil {
			t.Errorf("%s: Commit succeeded", name)
		}
	}
	if err := b.Commit(ctx, nil, good, "fp", nil); err == nil {
		t.Error("Commit without a transaction succeeded")
	}
	if _, _, _, err := b.Lookup(ctx, guard.Key{}); !errors.Is(err, guard.ErrInvalidKey) {
		t.Errorf("Lookup of an empty key = %v, want ErrInvalidKey", err)
	}
}

// TestCrashWindow: the first holder commits its business row and the
// backstop row, then "dies" before complete reaches Redis. After its lease
// ran out, the retry runs fn again, meets ErrAlreadyCommitted, rolls back,
// and the client gets the stored result; one business row exists.
func TestCrashWindow(t *testing.T) {
	t.Parallel()
	const lease = time.Second // long enough to still be held under a loaded machine
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	g := guard.New(rs, guard.Options{Lease: lease})
	key := newKey(t)

	first, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(t, db, b, first.Lease, "receipt-1"); err != nil {
		t.Fatalf("first holder's commit: %v", err)
	}
	// ... and the process dies here: no Complete, no heartbeat.

	if _, err := g.Do(ctx, key, "fp", notRun(t)); !errors.Is(err, guard.ErrInProgress) {
		t.Fatalf("retry during the dead holder's lease = %v, want ErrInProgress", err)
	}
	time.Sleep(lease + 50*time.Millisecond) // waiting for the Redis lease to expire

	var met error
	res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, key.String(), l.Fence); err != nil {
			return nil, err
		}
		met = b.Commit(ctx, tx, l, "fp", []byte("receipt-2"))
		var done *backstop.AlreadyCommittedError
		if errors.As(met, &done) {
			return done.Result, nil // rolled back by the deferred Rollback
		}
		if met != nil {
			return nil, met
		}
		return []byte("receipt-2"), tx.Commit()
	})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if !errors.Is(met, backstop.ErrAlreadyCommitted) {
		t.Fatalf("retry's Commit = %v, want ErrAlreadyCommitted", met)
	}
	if string(res.Value) != "receipt-1" || !res.Lease.Recovered || res.Lease.Fence != 2 {
		t.Fatalf("retry = %q under %+v; want receipt-1, recovered, fence 2", res.Value, res.Lease)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("payments = %d, want 1", rows)
	}
	// The retry completed the Redis record with the stored result.
	res, err = g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("fn ran after completion")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Value) != "receipt-1" {
		t.Fatalf("third call = %q, replayed %v, %v", res.Value, res.Replayed, err)
	}
}

// TestCrashWindowWrapped: the same crash under Wrap: the retry's claim
// finds the committed row and replays it without running fn, and teaches
// Redis the result.
func TestCrashWindowWrapped(t *testing.T) {
	t.Parallel()
	// Long enough for a claim through Wrap (Redis, then PostgreSQL) to
	// be answered before the guard's deadline on a loaded machine:
	// with 300ms, a commit slowed past it gets the claim refused as late.
	const lease = time.Second
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: lease})
	key := newKey(t)

	first, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(t, db, b, first.Lease, "receipt-1"); err != nil {
		t.Fatalf("first holder's commit: %v", err)
	}
	time.Sleep(lease + 50*time.Millisecond) // waiting for the Redis lease to expire

	res, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("fn ran for a committed key")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Value) != "receipt-1" {
		t.Fatalf("retry = %q, replayed %v, %v; want a replay of receipt-1", res.Value, res.Replayed, err)
	}
	rec, err := rs.Get(ctx, key)
	if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "receipt-1" {
		t.Fatalf("Redis record after the replay = %+v, %v; want completed with receipt-1", rec, err)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("payments = %d, want 1", rows)
	}
}

// TestStaleFenceAfterRecovery: holder A's lease runs out and B recovers
// the key (fence 2). A, still running, tries to commit: rejected with
// ErrStaleFence, before and regardless of B's commit. B commits. Shown on
// the PostgreSQL Store and on Redis under Wrap.
func TestStaleFenceAfterRecovery(t *testing.T) {
	t.Parallel()
	// Long enough for a claim through Wrap (Redis, then PostgreSQL) to
	// be answered before the guard's deadline on a loaded machine:
	// with 300ms, a commit slowed past it gets the claim refused as late.
	const lease = time.Second
	for _, tc := range []struct {
		name  string
		store func(t *testing.T, b *backstop.Backstop) guard.Store
	}{
		{"PostgresStore", func(t *testing.T, b *backstop.Backstop) guard.Store {
			return pgenv.Store(t, b.DB(), pgstore.Options{})
		}},
		{"WrappedRedis", func(t *testing.T, b *backstop.Backstop) guard.Store {
			rs := guardenv.Store(t, guard.RedisOptions{})
			return backstop.Wrap(rs, b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pgenv.Migrated(t, pgstore.Options{})
			pgenv.PaymentsTable(t, db)
			b := mustBackstop(t, db, pgstore.Options{})
			g := guard.New(tc.store(t, b), guard.Options{Lease: lease})
			key := newKey(t)

			a, err := g.Claim(ctx, key, "fp")
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(lease + 50*time.Millisecond) // A pauses past its lease
			bo, err := g.Claim(ctx, key, "fp")
			if err != nil || !bo.Lease.Recovered || bo.Lease.Fence <= a.Lease.Fence {
				t.Fatalf("recovering claim = %+v, %v", bo.Lease, err)
			}
			err = pay(t, db, b, a.Lease, "from A")
			var stale *backstop.StaleFenceError
			if !errors.As(err, &stale) || !errors.Is(err, backstop.ErrStaleFence) {
				t.Fatalf("A's commit after B recovered = %v, want ErrStaleFence", err)
			}
			if stale.Fence != a.Lease.Fence || stale.Seen != bo.Lease.Fence {
				t.Fatalf("StaleFenceError = %+v", stale)
			}
			if err := pay(t, db, b, bo.Lease, "from B"); err != nil {
				t.Fatalf("B's commit: %v", err)
			}
			if err := g.Complete(ctx, bo.Lease, []byte("from B")); err != nil {
				t.Fatalf("B's complete: %v", err)
			}
			if err := g.Complete(ctx, a.Lease, []byte("from A")); !errors.Is(err, guard.ErrLeaseLost) {
				t.Fatalf("A's complete = %v, want ErrLeaseLost", err)
			}
			// After B committed, A meets the committed row.
			if err := pay(t, db, b, a.Lease, "from A"); !errors.Is(err, backstop.ErrAlreadyCommitted) {
				t.Fatalf("A's commit after B's = %v, want ErrAlreadyCommitted", err)
			}
			if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
				t.Fatalf("payments = %d, want 1", rows)
			}
			var fence int64
			if err := db.QueryRowContext(ctx, `SELECT fence FROM payments`).Scan(&fence); err != nil || fence != bo.Lease.Fence {
				t.Fatalf("the payment carries fence %d (%v), want B's %d", fence, err, bo.Lease.Fence)
			}
		})
	}
}

// TestStoreCommitCompletesInTx: under the PostgreSQL Store, Commit in the
// business transaction completes the key itself; Guard.Do's Complete then
// finds it done.
func TestStoreCommitCompletesInTx(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	g := guard.New(s, guard.Options{})
	key := newKey(t)
	fn := b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, key.String(), l.Fence)
		return []byte("paid"), err
	})
	res, err := g.Do(ctx, key, "fp", fn)
	if err != nil || string(res.Value) != "paid" || res.Replayed {
		t.Fatalf("Do = %+v, %v", res, err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "paid" {
		t.Fatalf("record = %+v, %v", rec, err)
	}
	res, err = g.Do(ctx, key, "fp", fn)
	if err != nil || !res.Replayed || string(res.Value) != "paid" {
		t.Fatalf("second Do = %+v, %v", res, err)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("payments = %d, want 1", rows)
	}
}

// TestRedisLosesRecords: 500 keys, 4 calls each, 32 workers, on a Redis
// that is flushed twice mid-run; a call that loses its record to a flush
// is retried, as a client would. Exactly 500 payments; afterwards, with
// Redis flushed again, every key replays from PostgreSQL without running
// fn, and Redis learns the result back.
func TestRedisLosesRecords(t *testing.T) {
	t.Parallel()
	const keys, dups, workers = 500, 4, 32
	srv := testenv.StartRedis(t)
	client := srv.Client()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guard.NewRedisStore(client, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: 5 * time.Second})
	prefix := rand.Text()[:6]
	keyOf := func(i int) guard.Key { return guard.Key{Scope: "pay", ID: fmt.Sprintf("%s-%d", prefix, i)} }
	fnOf := func(i int) guard.Func {
		return b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, keyOf(i).String(), l.Fence)
			return fmt.Appendf(nil, "receipt-%d", i), err
		})
	}

	var answered, flushes atomic.Int64
	flushAt := map[int64]bool{keys * dups / 3: true, 2 * keys * dups / 3: true}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				// A client retries until it has an answer. In progress
				// means another delivery has the key, or had it: a holder
				// whose record the flush took, and whose Fail Redis then
				// refused, leaves its mark in Postgres for the rest of its
				// lease (seen on a loaded machine: the holder's INSERT got
				// "driver: bad connection"), so the client asks again after
				// the delay it is given, as after a 409.
				giveUp := time.Now().Add(time.Minute)
				for try := 0; ; {
					_, err := g.Do(ctx, keyOf(i), "fp", fnOf(i))
					if err == nil {
						break
					}
					if ip := (*guard.InProgressError)(nil); errors.As(err, &ip) && time.Now().Before(giveUp) {
						time.Sleep(min(max(ip.RetryAfter, 10*time.Millisecond), 200*time.Millisecond))
						continue
					}
					try++
					if try <= 10 && (errors.Is(err, guard.ErrLeaseLost) || errors.Is(err, backstop.ErrStaleFence)) {
						// The flush took this holder's record: its effect is
						// committed once or rolled back; ask again.
						continue
					}
					if try <= 10 && errors.Is(err, guard.ErrUnavailable) {
						// On two loaded cores a claim's Postgres mark can
						// outlast its bound (half the lease): the outcome is
						// unknown, and a client asks again, as after a 503.
						continue
					}
					t.Errorf("Do(%d): %v", i, err)
					break
				}
				if n := answered.Add(1); flushAt[n] {
					if err := client.FlushAll(ctx).Err(); err != nil {
						t.Errorf("FLUSHALL: %v", err)
					}
					flushes.Add(1)
				}
			}
		}()
	}
	for i := range keys {
		for range dups {
			jobs <- i
		}
	}
	close(jobs)
	wg.Wait()
	if flushes.Load() != 2 {
		t.Fatalf("flushed %d times, want 2", flushes.Load())
	}
	if rows, distinct := pgenv.CountPayments(t, db); rows != keys || distinct != keys {
		t.Fatalf("payments = %d rows for %d keys, want %d for %d", rows, distinct, keys, keys)
	}

	if err := client.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		res, err := g.Do(ctx, keyOf(i), "fp", func(context.Context, guard.Lease) ([]byte, error) {
			t.Errorf("key %d: fn ran after Redis lost a committed key", i)
			return nil, nil
		})
		if want := fmt.Sprintf("receipt-%d", i); err != nil || !res.Replayed || string(res.Value) != want {
			t.Fatalf("key %d after FLUSHALL = %q, replayed %v, %v; want a replay of %s", i, res.Value, res.Replayed, err, want)
		}
	}
	for _, i := range []int{0, keys / 2, keys - 1} {
		rec, err := rs.Get(ctx, keyOf(i))
		if err != nil || rec.State != guard.StateCompleted || !bytes.Equal(rec.Result, fmt.Appendf(nil, "receipt-%d", i)) {
			t.Fatalf("Redis record of key %d after the replay = %+v, %v", i, rec, err)
		}
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != keys {
		t.Fatalf("payments after the replays = %d, want %d", rows, keys)
	}
}

// TestRedisLosesRunningHolder: Redis loses the record while its holder is
// still running. While the holder's lease lasts, the next claim is told
// the key is in progress, and the Redis claim it made is released; once
// the lease ran out (the holder paused past it), the next holder gets a
// fence above the old one, though Redis hands out fence 1 again, and the
// old holder cannot commit.
func TestRedisLosesRunningHolder(t *testing.T) {
	t.Parallel()
	// The claim after the DEL must reach both stores while A's lease
	// lasts (several round trips): 500ms was within a stall of a loaded
	// machine. The wait for its end below polls, so a long lease costs
	// only its length.
	const lease = 2 * time.Second
	srv := testenv.StartRedis(t)
	client := srv.Client()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guard.NewRedisStore(client, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: lease})
	key := newKey(t)

	a, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := client.Del(ctx, rs.Name(key)).Result(); err != nil || n != 1 {
		t.Fatalf("DEL = %d, %v", n, err)
	}
	_, err = g.Claim(ctx, key, "fp")
	var busy *guard.InProgressError
	if !errors.As(err, &busy) || busy.RetryAfter <= 0 || busy.RetryAfter > lease {
		t.Fatalf("claim while the holder's lease lasts = %v, want ErrInProgress with up to %s left", err, lease)
	}
	if _, err := rs.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("the refused claim's Redis record: %v; want it released", err)
	}
	var bo guard.Outcome
	deadline := time.Now().Add(10 * time.Second)
	for { // the holder's lease runs out
		bo, err = g.Claim(ctx, key, "fp")
		if !errors.Is(err, guard.ErrInProgress) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	if bo.Lease.Fence <= a.Lease.Fence {
		t.Fatalf("fence after Redis lost the record = %d, want above %d", bo.Lease.Fence, a.Lease.Fence)
	}
	if err := pay(t, db, b, a.Lease, "A"); !errors.Is(err, backstop.ErrStaleFence) {
		t.Fatalf("old holder's commit = %v, want ErrStaleFence", err)
	}
	if err := pay(t, db, b, bo.Lease, "B"); err != nil {
		t.Fatalf("new holder's commit: %v", err)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("payments = %d, want 1", rows)
	}
	// Another payload under the lost key is a mismatch, and the Redis
	// claim it made is released.
	client.Del(ctx, rs.Name(key))
	if _, err := g.Claim(ctx, key, "other"); !errors.Is(err, guard.ErrMismatch) {
		t.Fatalf("claim with another fingerprint = %v, want ErrMismatch", err)
	}
	if _, err := rs.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("the mismatching claim left a Redis record: %v", err)
	}
	// Get falls back to the committed row.
	got, err := g.Get(ctx, key)
	if err != nil || got.State != guard.StateCompleted || string(got.Result) != "B" {
		t.Fatalf("Get through the wrapped store = %+v, %v", got, err)
	}
}

// TestCommitExpiredRow: a committed row past its retention counts as
// absent: Lookup does not find it and a new Commit takes its place.
func TestCommitExpiredRow(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	key := newKey(t)
	pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		VALUES ($1, $2, 'fp', 'completed', 'old', 7, 'old result', now() - interval '1 second')`, key.Scope, key.ID)
	if _, _, found, err := b.Lookup(ctx, key); found || err != nil {
		t.Fatalf("Lookup of an expired row = %v, %v; want not found", found, err)
	}
	if err := pay(t, db, b, guard.Lease{Key: key, Token: "new", Fence: 1, Attempt: 1}, "new result"); err != nil {
		t.Fatalf("Commit over an expired row: %v", err)
	}
	res, fence, found, err := b.Lookup(ctx, key)
	if err != nil || !found || string(res) != "new result" || fence != 1 {
		t.Fatalf("Lookup = %q, %d, %v, %v", res, fence, found, err)
	}
}

// TestWrapFailsClosed: when PostgreSQL cannot be reached, a claim on
// Redis is released and the caller gets ErrUnavailable at once; fn never
// runs. Behind a proxy that accepts connections and closes them (a pooler
// whose database is down), the mark's error is a connection cut after
// the statement went out, which the guard took for a lost answer: it
// released the claim again, and that release retried the mark's undo for
// seconds (found by review).
func TestWrapFailsClosed(t *testing.T) {
	t.Parallel()
	for name, addr := range map[string]string{
		"refused": fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		"closed":  closingListener(t),
	} {
		t.Run(name, func(t *testing.T) {
			db, err := sql.Open("postgres", "postgres://nobody@"+addr+"/none?sslmode=disable&connect_timeout=2")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			rs := guardenv.Store(t, guard.RedisOptions{})
			g := guard.New(backstop.Wrap(rs, mustBackstop(t, db, pgstore.Options{})), guard.Options{})
			key := newKey(t)
			start := time.Now()
			_, err = g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				t.Error("fn ran without the backstop")
				return nil, nil
			})
			if !errors.Is(err, guard.ErrUnavailable) {
				t.Fatalf("Do without PostgreSQL = %v, want ErrUnavailable", err)
			}
			// Each claim fails so while PostgreSQL is down: undoing its mark
			// is one try, not the seconds of retries a holder's Fail or
			// Release gets.
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("Do without PostgreSQL failed after %s; want at once", took)
			}
			if _, err := rs.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
				t.Fatalf("the Redis claim was not released: %v", err)
			}
		})
	}
}

// TestWrapFailsClosedOnExhaustedKey: a claim of a key Redis answers
// Exhausted asks PostgreSQL too; without it the claim fails closed at
// once, as one whose mark failed (TestWrapFailsClosed). Its error read as
// a lost answer, and the guard's release of the claim (which held nothing)
// retried the mark's undo for 4 s (found by review).
func TestWrapFailsClosedOnExhaustedKey(t *testing.T) {
	rs := guardenv.Store(t, guard.RedisOptions{})
	key := newKey(t)
	// Exhaust the key in Redis: one attempt, failed.
	g1 := guard.New(rs, guard.Options{MaxAttempts: 1})
	_, _ = g1.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return nil, errors.New("boom")
	})
	if _, err := g1.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Fatal("ran on an exhausted key")
		return nil, nil
	}); !errors.As(err, new(*guard.ExhaustedError)) {
		t.Fatalf("setup: second Do = %v, want ExhaustedError", err)
	}

	db, err := sql.Open("postgres", "postgres://nobody@"+closingListener(t)+"/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g := guard.New(backstop.Wrap(rs, mustBackstop(t, db, pgstore.Options{})), guard.Options{MaxAttempts: 1})
	start := time.Now()
	_, err = g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("fn ran on an exhausted key")
		return nil, nil
	})
	took := time.Since(start)
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("Do without PostgreSQL on an exhausted key = %v, want ErrUnavailable", err)
	}
	if took > 2*time.Second {
		t.Errorf("Do without PostgreSQL on an exhausted key failed after %s; want at once (as a claim whose mark failed, TestWrapFailsClosed)", took)
	}
}

// closingListener accepts every connection and closes it at once, as a
// connection pooler or proxy (pgbouncer, HAProxy, a cloud SQL proxy) does
// while the PostgreSQL behind it is down.
func closingListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

// TestCommitFenceRule: on a row not yet committed, Commit succeeds only
// for the row's own holder (same token) or a higher fence.
func TestCommitFenceRule(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	for _, tc := range []struct {
		status   string
		rowFence int64
		rowToken string
		fence    int64
		token    string
		want     error
	}{
		{"pending", 3, "B", 2, "A", backstop.ErrStaleFence},
		{"pending", 2, "B", 2, "A", backstop.ErrStaleFence},
		{"pending", 2, "A", 2, "A", nil},
		{"pending", 1, "B", 2, "A", nil},
		{"failed", 2, "B", 3, "A", nil},
		{"failed", 4, "B", 3, "A", backstop.ErrStaleFence},
		{"completed", 1, "B", 5, "A", backstop.ErrAlreadyCommitted},
		// An unguarded lease (fallback's FailOpen, fence 0) never
		// replaces a holder's row, even the least fenced one.
		{"pending", 1, "B", 0, "A", backstop.ErrStaleFence},
		{"failed", 1, "B", 0, "A", backstop.ErrStaleFence},
		{"completed", 1, "B", 0, "A", backstop.ErrAlreadyCommitted},
	} {
		key := newKey(t)
		pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, expires_at)
			VALUES ($1, $2, 'fp', $3, $4, $5, now() + interval '1 hour')`, key.Scope, key.ID, tc.status, tc.rowToken, tc.rowFence)
		err := pay(t, db, b, guard.Lease{Key: key, Token: tc.token, Fence: tc.fence, Attempt: 1}, "r")
		if (tc.want == nil && err != nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("row %s fence %d token %s, commit fence %d token %s: %v, want %v",
				tc.status, tc.rowFence, tc.rowToken, tc.fence, tc.token, err, tc.want)
		}
	}
}

// TestWrapExhaustedButCommitted: the only allowed attempt committed and
// died before completing; Redis calls the key exhausted, but the effect
// happened, so the wrapped store replays it.
func TestWrapExhaustedButCommitted(t *testing.T) {
	t.Parallel()
	// Long enough for a claim through Wrap (Redis, then PostgreSQL) to
	// be answered before the guard's deadline on a loaded machine:
	// with 300ms, a commit slowed past it gets the claim refused as late.
	const lease = time.Second
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: lease, MaxAttempts: 1})
	key, other := newKey(t), newKey(t)
	for _, k := range []guard.Key{key, other} {
		first, err := g.Claim(ctx, k, "fp")
		if err != nil {
			t.Fatal(err)
		}
		if k == key {
			if err := pay(t, db, b, first.Lease, "receipt"); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(lease + 50*time.Millisecond) // both holders die
	res, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("fn ran for a committed key")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Value) != "receipt" {
		t.Fatalf("committed key = %q, replayed %v, %v; want a replay", res.Value, res.Replayed, err)
	}
	// Without a commit, exhausted stays exhausted.
	if _, err := g.Do(ctx, other, "fp", notRun(t)); !errors.Is(err, guard.ErrExhausted) {
		t.Fatalf("uncommitted key = %v, want ErrExhausted", err)
	}
}

// TestStoreFenceGrowsPastRetention: a key claimed again after its record
// expired starts at attempt 1, but with a fence above the old one, so the
// old holder's late Commit is stale.
func TestStoreFenceGrowsPastRetention(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	s := pgenv.Store(t, db, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "retained"}
	req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: ttl, TTL: ttl}
	a, err := s.Claim(ctx, req)
	if err != nil || a.Status != guard.Acquired || a.Lease.Fence != 1 {
		t.Fatalf("first claim = %+v, %v", a, err)
	}
	time.Sleep(2*ttl + 50*time.Millisecond) // waiting for the lease, then the record's retention, to pass
	req.Token = "B"
	bo, err := s.Claim(ctx, req)
	if err != nil || bo.Status != guard.Acquired || bo.Lease.Attempt != 1 || bo.Lease.Recovered || bo.Lease.Fence != 2 {
		t.Fatalf("claim after retention = %+v, %v; want attempt 1, fence 2", bo.Lease, err)
	}
	if err := pay(t, db, b, a.Lease, "A"); !errors.Is(err, backstop.ErrStaleFence) {
		t.Fatalf("old holder's commit = %v, want ErrStaleFence", err)
	}
}

// TestNewRefusesBadInput: New returns the error of options that make no
// usable table names (and no Backstop); a nil database or a nil store
// given to Wrap is a programmer error and panics at once.
func TestNewRefusesBadInput(t *testing.T) {
	db := &sql.DB{} // never used: New fails before any query
	for name, o := range map[string]pgstore.Options{
		"long prefix": {TablePrefix: string(make([]byte, 60))},
		"NUL schema":  {Schema: "a\x00b"},
	} {
		if b, err := backstop.New(db, o); err == nil || b != nil {
			t.Errorf("%s: New = %v, %v; want nil and an error", name, b, err)
		}
	}
	if b, err := backstop.New(db, pgstore.Options{}); err != nil || b == nil {
		t.Fatalf("New with zero Options = %v, %v", b, err)
	}
	panics := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Errorf("%s did not panic", name)
			}
		}()
		f()
	}
	if b, err := backstop.New(nil, pgstore.Options{}); err == nil || b != nil {
		t.Errorf("New(nil) = %v, %v; want nil and an error", b, err)
	}
	good, _ := backstop.New(db, pgstore.Options{})
	panics("Wrap(nil, b)", func() { backstop.Wrap(nil, good) })
	panics("Wrap(store, nil)", func() { backstop.Wrap(memstore.New(memstore.Options{}), nil) })
}

// TestWrapExhaustedWithoutBackstop: primary calls a key exhausted and
// PostgreSQL cannot be reached, so whether the last holder committed is
// unknown. The wrapped store answers ErrUnavailable, not the final
// ErrExhausted (a consumer dead-letters on it); once PostgreSQL answers,
// the committed effect is replayed.
func TestWrapExhaustedWithoutBackstop(t *testing.T) {
	t.Parallel()
	// Long enough for a claim through Wrap (Redis, then PostgreSQL) to
	// be answered before the guard's deadline on a loaded machine:
	// with 300ms, a commit slowed past it gets the claim refused as late.
	const lease = time.Second
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	opts := guard.Options{Lease: lease, MaxAttempts: 1}
	g := guard.New(backstop.Wrap(rs, b), opts)
	key := newKey(t)
	first, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(t, db, b, first.Lease, "receipt"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(lease + 50*time.Millisecond) // the holder dies after its commit

	dsn := fmt.Sprintf("postgres://nobody@127.0.0.1:%d/none?sslmode=disable&connect_timeout=2", testenv.FreePort(t))
	down, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	cut := guard.New(backstop.Wrap(rs, mustBackstop(t, down, pgstore.Options{})), opts)
	_, err = cut.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("fn ran for a committed key")
		return nil, nil
	})
	if !errors.Is(err, guard.ErrUnavailable) || errors.Is(err, guard.ErrExhausted) {
		t.Fatalf("exhausted key without PostgreSQL = %v, want ErrUnavailable", err)
	}
	res, err := g.Do(ctx, key, "fp", notRun(t))
	if err != nil || !res.Replayed || string(res.Value) != "receipt" {
		t.Fatalf("with PostgreSQL back = %q, replayed %v, %v; want the committed receipt", res.Value, res.Replayed, err)
	}
}

// TestFailAndReleaseEndMarkLease: a holder's Fail, and its Release of a
// later attempt, end its lease on the mark as they do in Redis: the next
// attempt is acquired at once, not told the key is in progress for the
// rest of a lease nobody holds.
func TestFailAndReleaseEndMarkLease(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{Lease: time.Minute})
	key := newKey(t)

	a, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Fail(ctx, a.Lease, errors.New("declined")); err != nil {
		t.Fatal(err)
	}
	second, err := g.Claim(ctx, key, "fp")
	if err != nil || second.Lease.Attempt != 2 {
		t.Fatalf("claim after a failure = %+v, %v; want attempt 2", second.Lease, err)
	}
	if err := g.Release(ctx, second.Lease); err != nil {
		t.Fatal(err)
	}
	third, err := g.Claim(ctx, key, "fp")
	if err != nil || third.Lease.Fence <= second.Lease.Fence {
		t.Fatalf("claim after a release = %+v, %v; want acquired above fence %d", third.Lease, err, second.Lease.Fence)
	}

	// The same through a batch's writes.
	keys := []guard.BatchItem{{Key: newKey(t), Fingerprint: "fp"}, {Key: newKey(t), Fingerprint: "fp"}}
	for _, r := range g.DoBatch(ctx, keys, func(context.Context, int, guard.Lease) ([]byte, error) {
		return nil, errors.New("declined")
	}, guard.BatchOptions{}) {
		if r.Err == nil {
			t.Fatal("a failing effect's batch item succeeded")
		}
	}
	for _, it := range keys {
		if out, err := g.Claim(ctx, it.Key, "fp"); err != nil || out.Lease.Attempt != 2 {
			t.Fatalf("claim after a batch's failure = %+v, %v; want attempt 2", out.Lease, err)
		}
	}
}
