package pgstore_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestPurgeBatches: 100,000 expired keys and 1,000 expired consumed
// messages go in batches of 5,000; 1,000 live keys and 10 live messages
// stay.
func TestPurgeBatches(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := pgenv.Store(t, db, pgstore.Options{})
	pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		SELECT 'old', 'k' || i, 'fp', 'completed', 't', 1, 'r', now() - interval '1 minute'
		FROM generate_series(1, 100000) AS i`)
	pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		SELECT 'live', 'k' || i, 'fp', 'completed', 't', 1, 'r', now() + interval '1 hour'
		FROM generate_series(1, 1000) AS i`)
	pgenv.Exec(t, db, `INSERT INTO idemguard_consumed_messages (consumer_group, message_id, expires_at)
		SELECT 'g', 'm' || i, CASE WHEN i <= 1000 THEN now() - interval '1 second' ELSE now() + interval '1 hour' END
		FROM generate_series(1, 1010) AS i`)

	var calls int
	var last = map[string]int64{}
	n, err := b.Purge(ctx, pgstore.PurgeOptions{BatchSize: 5000, Progress: func(table string, deleted int64) {
		calls++
		if deleted <= last[table] {
			t.Errorf("progress of %s went from %d to %d", table, last[table], deleted)
		}
		last[table] = deleted
	}})
	if err != nil {
		t.Fatalf("Purge: %v", err)
	}
	if n != 101000 || last["keys"] != 100000 || last["consumed_messages"] != 1000 {
		t.Fatalf("purged %d (keys %d, messages %d), want 101000", n, last["keys"], last["consumed_messages"])
	}
	if calls != 21 { // 20 batches of keys, 1 of messages
		t.Fatalf("progress calls = %d, want 21 (batches of 5000)", calls)
	}
	var live, old, msgs int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE scope = 'live'), count(*) FILTER (WHERE scope = 'old') FROM idemguard_keys`).Scan(&live, &old); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_consumed_messages`).Scan(&msgs); err != nil {
		t.Fatal(err)
	}
	if live != 1000 || old != 0 || msgs != 10 {
		t.Fatalf("after purge: %d live keys, %d expired keys, %d messages; want 1000, 0, 10", live, old, msgs)
	}
	if n, err := b.Purge(ctx, pgstore.PurgeOptions{}); n != 0 || err != nil {
		t.Fatalf("second purge = %d, %v; want 0", n, err)
	}
	if _, err := b.Purge(ctx, pgstore.PurgeOptions{BatchSize: -1}); err == nil {
		t.Fatal("Purge with a negative batch size succeeded")
	}
}

// TestPurgeBefore: only rows expired at least Before ago go.
func TestPurgeBefore(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := pgenv.Store(t, db, pgstore.Options{})
	pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		SELECT 'long-ago', 'k' || i, 'fp', 'completed', 't', 1, 'r', now() - interval '2 hours'
		FROM generate_series(1, 30) AS i`)
	pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		SELECT 'recent', 'k' || i, 'fp', 'completed', 't', 1, 'r', now() - interval '5 minutes'
		FROM generate_series(1, 20) AS i`)
	n, err := b.Purge(ctx, pgstore.PurgeOptions{Before: time.Hour, BatchSize: 7})
	if err != nil || n != 30 {
		t.Fatalf("Purge(Before 1h) = %d, %v; want the 30 rows expired 2h ago", n, err)
	}
	var recent int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys WHERE scope = 'recent'`).Scan(&recent); err != nil {
		t.Fatal(err)
	}
	if recent != 20 {
		t.Fatalf("%d recently expired rows left, want 20", recent)
	}
	if n, err := b.Purge(ctx, pgstore.PurgeOptions{}); err != nil || n != 20 {
		t.Fatalf("Purge() = %d, %v; want the 20 remaining expired rows", n, err)
	}
	if _, err := b.Purge(ctx, pgstore.PurgeOptions{Before: -time.Second}); err == nil {
		t.Fatal("Purge with a negative Before succeeded")
	}
}

// TestPurgeSteps: expired step rows go with the others; live ones stay.
func TestPurgeSteps(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := pgenv.Store(t, db, pgstore.Options{})
	pgenv.Exec(t, db, `INSERT INTO idemguard_steps (scope, id, name, result, fence, token, expires_at)
		SELECT 's', 'k' || i, 'reserve', 'r', 1, 't', CASE WHEN i <= 50 THEN now() - interval '1 second' ELSE now() + interval '1 hour' END
		FROM generate_series(1, 60) AS i`)
	var last int64
	n, err := b.Purge(ctx, pgstore.PurgeOptions{BatchSize: 20, Progress: func(table string, deleted int64) {
		if table == "steps" {
			last = deleted
		}
	}})
	if err != nil || n != 50 || last != 50 {
		t.Fatalf("Purge = %d (steps %d), %v; want 50", n, last, err)
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_steps`).Scan(&left); err != nil || left != 10 {
		t.Fatalf("%d step rows left, %v; want 10", left, err)
	}
}

// TestPurgeStrictIsolation: on a database whose default isolation is
// REPEATABLE READ, a purge batch that meets an expired row changed after
// the batch's statement began (a claim taking the key over, a commit)
// fails with a serialization failure, which changed nothing: it is run
// again, as the Store's statements are, not returned (a purge under
// traffic failed so every few runs). The change is made while the batch
// waits for a table lock after its snapshot was taken: one round trip
// per statement (binary_parameters, as pgx sends them too).
func TestPurgeStrictIsolation(t *testing.T) {
	t.Parallel()
	db, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	rr := testenv.DSNWithIsolation(t, dsn, "repeatable read") + "&binary_parameters=yes"
	rdb, err := sql.Open("postgres", rr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rdb.Close() })
	s := pgenv.Store(t, rdb, pgstore.Options{})
	pgenv.Exec(t, db, `INSERT INTO idemguard_keys (scope, id, fingerprint, status, token, fence, result, expires_at)
		VALUES ('s', 'old', 'fp', 'completed', 't', 1, 'r', now() - interval '1 minute')`)

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `LOCK TABLE idemguard_keys IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE idemguard_keys SET last_error = 'touched' WHERE scope = 's' AND id = 'old'`); err != nil {
		t.Fatal(err)
	}
	type purged struct {
		n   int64
		err error
	}
	done := make(chan purged, 1)
	go func() {
		n, err := s.Purge(ctx, pgstore.PurgeOptions{})
		done <- purged{n, err}
	}()
	testenv.WaitFor(t, 10*time.Second, "the purge of the keys to wait for the table lock", func() bool {
		var waiting bool
		if err := db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE relation = 'idemguard_keys'::regclass AND NOT granted)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		return waiting
	})
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if got.err != nil || got.n != 1 {
		t.Fatalf("Purge = %d, %v; want the expired row purged", got.n, got.err)
	}
}
