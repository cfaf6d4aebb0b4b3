package backstop_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// payFn is Func's effect in these tests: a payment row, no unique
// constraint (only the backstop's row keeps it single).
func payFn(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
	_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence)
	return []byte("paid by " + l.Token), err
}

// isolatedDB is pgenv.Isolated's database with the payments table.
func isolatedDB(t *testing.T, level string) (direct, db *sql.DB) {
	t.Helper()
	direct, db, _ = pgenv.Isolated(t, level)
	pgenv.PaymentsTable(t, direct)
	return direct, db
}

// TestCommitStrictIsolation: at REPEATABLE READ and SERIALIZABLE, a
// transaction whose Commit waited for another's row of the key, which
// then committed, is refused with a serialization failure (40001: the row
// is not in its snapshot): Commit answers guard.ErrUnavailable, never
// success, and the loser's business write is rolled back with it. Func,
// whose transaction takes the database's default isolation, answers that
// loser with the committed result, as it does at READ COMMITTED (where
// Commit says ErrAlreadyCommitted); it returned guard.ErrUnavailable.
func TestCommitStrictIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			direct, db := isolatedDB(t, level)
			b := mustBackstop(t, db, pgstore.Options{})

			// The first holder's transaction commits the key's row and
			// holds it; each contender's Commit waits for that row.
			for _, via := range []string{"Commit", "Func"} {
				key := newKey(t)
				first, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				var holder int
				if err := first.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
					t.Fatal(err)
				}
				if _, err := payFn(ctx, first, guard.Lease{Key: key, Token: "A", Fence: 1}); err != nil {
					t.Fatal(err)
				}
				if err := b.Commit(ctx, first, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}, "fp", []byte("paid by A")); err != nil {
					t.Fatal(err)
				}
				type answer struct {
					res []byte
					err error
				}
				done := make(chan answer, 1)
				l := guard.Lease{Key: key, Token: "B", Fence: 1, Attempt: 1}
				go func() {
					if via == "Func" {
						res, err := b.Func("fp", payFn)(ctx, l)
						done <- answer{res, err}
						return
					}
					tx, err := db.BeginTx(ctx, nil)
					if err != nil {
						done <- answer{nil, err}
						return
					}
					defer func() { _ = tx.Rollback() }()
					if _, err := payFn(ctx, tx, l); err != nil {
						done <- answer{nil, err}
						return
					}
					if err := b.Commit(ctx, tx, l, "fp", []byte("paid by B")); err != nil {
						done <- answer{nil, err}
						return
					}
					done <- answer{[]byte("paid by B"), tx.Commit()}
				}()
				testenv.WaitFor(t, 30*time.Second, "the contender to wait for the first's row", func() bool {
					var n int
					_ = direct.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&n)
					return n > 0
				})
				if err := first.Commit(); err != nil {
					t.Fatal(err)
				}
				a := <-done
				switch {
				case via == "Func":
					if a.err != nil || string(a.res) != "paid by A" {
						t.Errorf("%s: contender's Func = %q, %v; want the committed %q", via, a.res, a.err, "paid by A")
					}
				case level == "read committed":
					if !errors.Is(a.err, backstop.ErrAlreadyCommitted) {
						t.Errorf("%s: contender's Commit = %v; want ErrAlreadyCommitted", via, a.err)
					}
				default:
					if !errors.Is(a.err, guard.ErrUnavailable) {
						t.Errorf("%s: contender's Commit = %v; want guard.ErrUnavailable (a serialization failure)", via, a.err)
					}
				}
				var rows int
				if err := direct.QueryRowContext(ctx, `SELECT count(*) FROM payments WHERE key = $1`, key.String()).Scan(&rows); err != nil || rows != 1 {
					t.Errorf("%s: payments = %d, %v; want 1", via, rows, err)
				}
			}
		})
	}
}

// proxiedBackstop is a backstop on a migrated database with the payments
// table, reached through p.
func proxiedBackstop(t *testing.T) (p *pgproxy.Proxy, db *sql.DB, b *backstop.Backstop) {
	t.Helper()
	_, dsn := testenv.Postgres(t)
	p, db = pgproxy.New(t, dsn)
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	pgenv.PaymentsTable(t, db)
	return p, db, mustBackstop(t, db, pgstore.Options{})
}

// TestFuncCommitReplyLost: the reply to Func's COMMIT is lost after the
// server committed (the connection dies). Func reads the key's row on
// another connection, finds it committed with its fingerprint, and answers
// the result; a retry replays it and the payment is made once. Func
// answered guard.ErrUnavailable, though the effect had committed.
func TestFuncCommitReplyLost(t *testing.T) {
	t.Parallel()
	p, db, b := proxiedBackstop(t)
	key := newKey(t)
	p.LoseReply("COMMIT")
	res, err := b.Func("fp", payFn)(ctx, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1})
	if p.Cuts() != 1 {
		t.Fatalf("the proxy lost %d replies, want 1", p.Cuts())
	}
	if err != nil || string(res) != "paid by A" {
		t.Fatalf("Func whose COMMIT's reply was lost = %q, %v; want %q", res, err, "paid by A")
	}
	res, err = b.Func("fp", payFn)(ctx, guard.Lease{Key: key, Token: "B", Fence: 2, Attempt: 2})
	if err != nil || string(res) != "paid by A" {
		t.Fatalf("retry = %q, %v; want the replay of %q", res, err, "paid by A")
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("payments = %d, want 1", rows)
	}
}

// TestStepCommitReplyLost: the reply to a backstopped step's COMMIT is lost
// after the server committed. Step reads the step's row on another
// connection and answers its result, which the guard stores with the
// key's record; the reservation is made once. Step answered
// guard.ErrUnavailable, and the attempt failed though its step was made.
func TestStepCommitReplyLost(t *testing.T) {
	t.Parallel()
	p, db, b := proxiedBackstop(t)
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	key := newKey(t)
	p.LoseReply("COMMIT")
	res, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		return b.Step(ctx, l, "pay", payFn)
	})
	if p.Cuts() != 1 {
		t.Fatalf("the proxy lost %d replies, want 1", p.Cuts())
	}
	if err != nil || !bytes.HasPrefix(res.Value, []byte("paid by ")) {
		t.Fatalf("Do whose step's COMMIT reply was lost = %q, %v; want the step's result", res.Value, err)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("payments = %d, want 1", rows)
	}
}

// TestFuncRaceStrictIsolation: 8 Func calls of one key at once, on a
// database whose default isolation is REPEATABLE READ or SERIALIZABLE:
// one payment, and every call answers the winner's result without error
// (the losers' serialization failures are answered from the committed
// row).
func TestFuncRaceStrictIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			direct, db := isolatedDB(t, level)
			b := mustBackstop(t, db, pgstore.Options{})
			key := newKey(t)
			results := make([][]byte, 8)
			errs := make([]error, 8)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					results[i], errs[i] = b.Func("fp", payFn)(ctx, guard.Lease{Key: key, Token: fmt.Sprint("T", i), Fence: 1, Attempt: 1})
				}()
			}
			close(start)
			wg.Wait()
			for i := range results {
				if errs[i] != nil || !bytes.Equal(results[i], results[0]) {
					t.Errorf("call %d = %q, %v; want %q like call 0", i, results[i], errs[i], results[0])
				}
			}
			if rows, _ := pgenv.CountPayments(t, direct); rows != 1 {
				t.Fatalf("payments = %d, want 1", rows)
			}
		})
	}
}
