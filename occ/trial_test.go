package occ_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// TestVectorCounterNoLostIncrements: 8 writers, each with an id of its
// own, add 1 to a grow-only counter (a JSON map writer → count) 12 times
// each, all at once through one pool, starting before the row exists.
// Each reads the row, adds to its own entry and writes on the vector it
// read; a refused write (*VectorConflictError) is done again on the row as
// it is. No increment is lost or counted twice (the sum is 96), and each
// writer's counter in the stored vector is the number of its writes that
// went through.
func TestVectorCounterNoLostIncrements(t *testing.T) {
	t.Parallel()
	const writers, increments = 8, 12
	db := database(t)
	mustExec(t, db, `CREATE TABLE occ_gcounter (id text PRIMARY KEY, value bytea NOT NULL DEFAULT '{}')`)
	base := occ.VectorTable{Name: "occ_gcounter"}
	m, err := base.Migration()
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, m.Up)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		wrote     = map[string]uint64{}
		conflicts int
	)
	errs := make(chan error, writers)
	start := make(chan struct{})
	for i := range writers {
		tbl := base
		tbl.Writer = fmt.Sprintf("w%d", i)
		wg.Go(func() {
			<-start
			for range increments {
				for {
					v, err := tbl.Read(ctx, db, "c")
					if err != nil && !errors.Is(err, occ.ErrNotFound) {
						errs <- err
						return
					}
					counts := map[string]int{}
					if len(v.Value) > 0 {
						if err := json.Unmarshal(v.Value, &counts); err != nil {
							errs <- err
							return
						}
					}
					counts[tbl.Writer]++
					b, _ := json.Marshal(counts)
					_, err = tbl.Write(ctx, db, "c", v.Vector, b)
					var ce *occ.VectorConflictError
					if errors.As(err, &ce) {
						mu.Lock()
						conflicts++
						mu.Unlock()
						continue
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					wrote[tbl.Writer]++
					mu.Unlock()
					break
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	v, err := base.Read(ctx, db, "c")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	if err := json.Unmarshal(v.Value, &counts); err != nil {
		t.Fatal(err)
	}
	sum := 0
	for w, n := range counts {
		sum += n
		if n != increments {
			t.Errorf("writer %s: %d increments stored, want %d", w, n, increments)
		}
	}
	if sum != writers*increments {
		t.Errorf("sum %d, want %d: increments lost or doubled", sum, writers*increments)
	}
	for w, n := range wrote {
		if got := v.Vector.Get(w); got != n {
			t.Errorf("writer %s: vector counter %d, %d writes went through", w, got, n)
		}
	}
	t.Logf("%d conflicts redone; vector %s", conflicts, v.Vector)
}

// TestVersionedTransfersInTransactions: 12 goroutines each move 1 from
// account 1 to account 2, 6 times, every move a REPEATABLE READ
// transaction of two UpdateRetry calls run again whole (RetryOnConflict)
// when UpdateRetry reports its transaction aborted. No move is lost or
// made twice: the balances are 100-72 and 72, each row at version 1+72,
// and the total stays 100.
func TestVersionedTransfersInTransactions(t *testing.T) {
	t.Parallel()
	const goroutines, moves = 12, 6
	db, dsn := testenv.Postgres(t)
	mustExec(t, db, `CREATE TABLE occ_accounts (id int PRIMARY KEY, balance bigint NOT NULL, version bigint NOT NULL DEFAULT 1)`)
	mustExec(t, db, `INSERT INTO occ_accounts (id, balance) VALUES (1, 100), (2, 0)`)
	rr, err := sql.Open("postgres", testenv.DSNWithIsolation(t, dsn, "repeatable read"))
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	acc := occ.VersionedTable{Name: "occ_accounts"}
	opts := occ.RetryOptions{MaxTries: 1000, InitialInterval: time.Millisecond, MaxInterval: 20 * time.Millisecond}
	add := func(ctx context.Context, tx *sql.Tx, id int, delta int64) error {
		_, err := acc.UpdateRetry(ctx, tx, id, opts, func(ctx context.Context) (int64, map[string]any, error) {
			var b, v int64
			err := tx.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = $1`, id).Scan(&b, &v)
			return v, map[string]any{"balance": b + delta}, err
		})
		return err
	}
	var wg sync.WaitGroup
	var txs atomic.Int32
	errs := make(chan error, goroutines)
	for range goroutines {
		wg.Go(func() {
			for range moves {
				err := occ.RetryOnConflict(ctx, opts, func(ctx context.Context) error {
					txs.Add(1)
					tx, err := rr.BeginTx(ctx, nil)
					if err != nil {
						return err
					}
					defer func() { _ = tx.Rollback() }()
					if err := add(ctx, tx, 1, -1); err != nil {
						return err
					}
					if err := add(ctx, tx, 2, 1); err != nil {
						return err
					}
					return tx.Commit()
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rows, err := db.QueryContext(ctx, `SELECT id, balance, version FROM occ_accounts ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	want := map[int][2]int64{1: {100 - goroutines*moves, 1 + goroutines*moves}, 2: {goroutines * moves, 1 + goroutines*moves}}
	for rows.Next() {
		var id int
		var b, v int64
		if err := rows.Scan(&id, &b, &v); err != nil {
			t.Fatal(err)
		}
		if w := want[id]; b != w[0] || v != w[1] {
			t.Errorf("account %d: balance %d at version %d, want %d at %d", id, b, v, w[0], w[1])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d transactions for %d moves", txs.Load(), goroutines*moves)
}
