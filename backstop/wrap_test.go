package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// unreachable wraps the real Redis store; its next Complete calls fail as
// they do while Redis restarts (go-redis answers new connections with its
// last dial error for up to a second).
type unreachable struct {
	guard.Store
	failCompletes atomic.Int64
}

func (u *unreachable) Complete(ctx context.Context, lease guard.Lease, result []byte, ttl time.Duration) error {
	if u.failCompletes.Add(-1) >= 0 {
		return fmt.Errorf("%w: dial tcp: connection refused (injected)", guard.ErrUnavailable)
	}
	return u.Store.Complete(ctx, lease, result, ttl)
}

// TestWrapNeverStrandsKey: when Redis forgot a committed key, the wrapped store
// answers the claim from PostgreSQL and completes the claim Redis just
// granted; if Redis cannot be written for a moment the write is retried,
// and if it cannot be written at all the claim is released: the key is
// never left pending for a lease (every retry would be told 409 meanwhile
// though PostgreSQL holds the answer). A holder's Complete through the wrapped store
// is retried the same way.
func TestWrapNeverStrandsKey(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	u := &unreachable{Store: rs}
	g := guard.New(backstop.Wrap(u, b), guard.Options{})
	fn := func(i int) guard.Func {
		return b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.String(), l.Fence)
			return fmt.Appendf(nil, "receipt-%d", i), err
		})
	}
	forget := func(k guard.Key) {
		if err := rdb.Del(ctx, rs.Name(k)).Err(); err != nil {
			t.Fatal(err)
		}
	}

	// The holder's own Complete fails twice: retried, stored.
	k1 := newKey(t)
	u.failCompletes.Store(2)
	if res, err := g.Do(ctx, k1, "fp", fn(1)); err != nil || string(res.Value) != "receipt-1" {
		t.Fatalf("Do with a flaky Complete = %q, %v", res.Value, err)
	}
	if rec, err := rs.Get(ctx, k1); err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("record after a flaky Complete: %+v, %v", rec, err)
	}

	for _, tc := range []struct {
		name  string
		fails int64
		want  error // of rs.Get afterwards; nil means completed
	}{
		{"redis back within the budget", 3, nil},
		{"redis still down", 1 << 20, guard.ErrNotFound},
	} {
		forget(k1)
		u.failCompletes.Store(tc.fails)
		start := time.Now()
		res, err := g.Do(ctx, k1, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			t.Errorf("%s: fn ran for a committed key", tc.name)
			return nil, nil
		})
		if err != nil || !res.Replayed || string(res.Value) != "receipt-1" {
			t.Fatalf("%s: Do = %q replayed %v, %v", tc.name, res.Value, res.Replayed, err)
		}
		rec, err := rs.Get(ctx, k1)
		switch {
		case tc.want == nil && (err != nil || rec.State != guard.StateCompleted):
			t.Fatalf("%s: Redis record %+v, %v; want completed", tc.name, rec, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Fatalf("%s: Redis record %+v, %v; want released, not pending", tc.name, rec, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("%s: the replay took %s", tc.name, took)
		}
	}
	// Released: the next claim goes to the backstop at once.
	u.failCompletes.Store(0)
	if res, err := g.Do(ctx, k1, "fp", fn(9)); err != nil || !res.Replayed || string(res.Value) != "receipt-1" {
		t.Fatalf("after the release: %q replayed %v, %v", res.Value, res.Replayed, err)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 1 {
		t.Fatalf("%d payments, want 1", rows)
	}
}

// TestWrapContract: a Redis store wrapped by Wrap is still a valid
// Store (the many-keys race is smaller: each claim also writes a mark).
func TestWrapContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			rs := guardenv.Store(t, guard.RedisOptions{})
			return backstop.Wrap(rs, mustBackstop(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{}))
		},
		Advance:    storetest.Wait,
		Keys:       100,
		Duplicates: 4,
	})
}
