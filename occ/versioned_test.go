package occ_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/occ"
)

func accountsTable(t *testing.T, db *sql.DB) occ.VersionedTable {
	t.Helper()
	mustExec(t, db, `CREATE TABLE occ_accounts (id int PRIMARY KEY, balance bigint NOT NULL, note text NOT NULL DEFAULT '', version bigint NOT NULL DEFAULT 1)`)
	mustExec(t, db, `INSERT INTO occ_accounts (id, balance) VALUES (1, 100)`)
	return occ.VersionedTable{Name: "occ_accounts"}
}

func readAccount(t *testing.T, db *sql.DB) (balance, version int64) {
	t.Helper()
	if err := db.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&balance, &version); err != nil {
		t.Fatal(err)
	}
	return balance, version
}

// TestVersionedTwoUpdaters: two writers read version 1 and update at once:
// one wins, the other gets ErrConflict; retried, it sees the winner's
// balance and adds to it.
func TestVersionedTwoUpdaters(t *testing.T) {
	t.Parallel()
	db := database(t)
	acc := accountsTable(t, db)
	balance, version := readAccount(t, db)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	start := make(chan struct{})
	for i, delta := range []int64{+10, -30} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = acc.Update(ctx, db, 1, version, map[string]any{"balance": balance + delta})
		}()
	}
	close(start)
	wg.Wait()
	var won, lost int
	var loserDelta int64
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case errors.Is(err, occ.ErrConflict):
			lost++
			loserDelta = []int64{+10, -30}[i]
		default:
			t.Fatalf("Update: %v", err)
		}
	}
	if won != 1 || lost != 1 {
		t.Fatalf("won %d, conflicts %d; want 1 and 1", won, lost)
	}
	winner, v2 := readAccount(t, db)
	if v2 != version+1 {
		t.Fatalf("version after one update = %d, want %d", v2, version+1)
	}
	var tries int
	err := occ.RetryOnConflict(ctx, occ.RetryOptions{}, func(ctx context.Context) error {
		tries++
		b, v := readAccount(t, db) // re-read before each try
		if tries == 1 && (b != winner || v != v2) {
			t.Errorf("retry read %d@%d, want the committed %d@%d", b, v, winner, v2)
		}
		_, err := acc.Update(ctx, db, 1, v, map[string]any{"balance": b + loserDelta, "note": "retried"})
		return err
	})
	if err != nil || tries != 1 {
		t.Fatalf("retry = %v after %d tries", err, tries)
	}
	if b, v := readAccount(t, db); b != 100+10-30 || v != version+2 {
		t.Fatalf("final = %d@%d, want 80@%d", b, v, version+2)
	}
}

// TestVersionedFiftyIncrements: 50 goroutines add 1 through the helper
// and the retry loop; the counter ends at exactly 50 more.
func TestVersionedFiftyIncrements(t *testing.T) {
	t.Parallel()
	db := database(t)
	acc := accountsTable(t, db)
	const n = 50
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := occ.RetryOptions{MaxTries: 1000, InitialInterval: time.Millisecond, MaxInterval: 20 * time.Millisecond}
			_, err := acc.UpdateRetry(ctx, db, 1, opts, func(ctx context.Context) (int64, map[string]any, error) {
				var b, v int64
				err := db.QueryRowContext(ctx, `SELECT balance, version FROM occ_accounts WHERE id = 1`).Scan(&b, &v)
				return v, map[string]any{"balance": b + 1}, err
			})
			if err != nil {
				t.Errorf("increment: %v", err)
			}
		}()
	}
	wg.Wait()
	if b, v := readAccount(t, db); b != 100+n || v != 1+n {
		t.Fatalf("counter = %d at version %d, want %d at %d", b, v, 100+n, 1+n)
	}
}

func TestVersionedBadInput(t *testing.T) {
	t.Parallel()
	db := database(t)
	acc := accountsTable(t, db)
	for name, set := range map[string]map[string]any{
		"nothing":     {},
		"the version": {"version": 9},
		"the id":      {"id": 2},
		"empty name":  {"": 1},
	} {
		if _, err := acc.Update(ctx, db, 1, 1, set); err == nil || errors.Is(err, occ.ErrConflict) {
			t.Errorf("setting %s = %v, want a plain error", name, err)
		}
	}
	if _, err := (occ.VersionedTable{}).Update(ctx, db, 1, 1, map[string]any{"balance": 1}); err == nil {
		t.Error("Update of a table without a name succeeded")
	}
	// A missing row is a conflict: nothing matched.
	if _, err := acc.Update(ctx, db, 42, 1, map[string]any{"balance": 1}); !errors.Is(err, occ.ErrConflict) {
		t.Errorf("update of a missing row = %v, want ErrConflict", err)
	}
	// A quoted column name cannot break out of its quotes.
	if _, err := acc.Update(ctx, db, 1, 1, map[string]any{`balance" = 0, "note`: 1}); err == nil {
		t.Error("a column name with quotes was spliced")
	}
	if b, v := readAccount(t, db); b != 100 || v != 1 {
		t.Fatalf("bad updates changed the row: %d@%d", b, v)
	}
	// Other errors end the retry loop at once.
	boom := errors.New("boom")
	tries := 0
	if err := occ.RetryOnConflict(ctx, occ.RetryOptions{}, func(context.Context) error { tries++; return boom }); !errors.Is(err, boom) || tries != 1 {
		t.Errorf("retry of a non-conflict = %v after %d tries", err, tries)
	}
	tries = 0
	err := occ.RetryOnConflict(ctx, occ.RetryOptions{MaxTries: 3, InitialInterval: time.Microsecond}, func(context.Context) error {
		tries++
		return occ.ErrConflict
	})
	if !errors.Is(err, occ.ErrConflict) || tries != 3 {
		t.Errorf("endless conflicts = %v after %d tries, want ErrConflict after 3", err, tries)
	}
}
