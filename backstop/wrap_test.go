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
		Parallel:   true,
		Keys:       100,
		Duplicates: 4,
		// The lease bears the backstop's fence, which its row keeps after
		// a released first attempt or an expired Redis record.
		FencesOutliveRecords: true,
	})
}

// TestWrapBatches: over a primary that serves batches, the wrapped store
// serves them too (it went key by key): a DoBatch of 16 takes Redis's
// round trips for the whole batch, each key is marked in PostgreSQL
// (its fence is the backstop's), a key committed in PostgreSQL that Redis
// forgot is replayed from there, and the next batch replays every key.
func TestWrapBatches(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	trips := testenv.CountTrips(rdb)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	if err := rs.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	wrapped := backstop.Wrap(rs, b)
	if _, ok := wrapped.(guard.BatchStore); !ok {
		t.Fatal("the wrapped RedisStore is not a guard.BatchStore")
	}
	if _, ok := wrapped.(guard.StepStore); !ok {
		t.Fatal("the wrapped RedisStore is not a guard.StepStore")
	}
	g := guard.New(wrapped, guard.Options{})

	// One key committed in PostgreSQL whose record Redis lost.
	forgotten := newKey(t)
	first, err := g.Claim(ctx, forgotten, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(t, db, b, first.Lease, "receipt"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, rs.Name(forgotten)).Err(); err != nil {
		t.Fatal(err)
	}

	items := []guard.BatchItem{{Key: forgotten, Fingerprint: "fp"}}
	for range 15 {
		items = append(items, guard.BatchItem{Key: newKey(t), Fingerprint: "fp"})
	}
	var ran atomic.Int32
	fn := func(_ context.Context, i int, l guard.Lease) ([]byte, error) {
		ran.Add(1)
		if l.Fence < 1 {
			t.Errorf("item %d ran with fence %d", i, l.Fence)
		}
		return []byte("done"), nil
	}
	before := trips.Load()
	out := g.DoBatch(ctx, items, fn, guard.BatchOptions{})
	// The claims, the completion of the key Redis forgot, the writes.
	if n := trips.Load() - before; n != 3 {
		t.Errorf("a batch of 16 through the wrapped store took %d Redis round trips, want 3", n)
	}
	if r := out[0]; r.Err != nil || !r.Replayed || string(r.Value) != "receipt" {
		t.Errorf("the key Redis forgot = %+v; want the receipt committed in PostgreSQL", r)
	}
	for i, r := range out[1:] {
		if r.Err != nil || r.Replayed {
			t.Errorf("item %d = %+v; want it run", i+1, r)
		}
	}
	if n := ran.Load(); n != 15 {
		t.Errorf("%d effects ran, want 15", n)
	}
	for i, r := range g.DoBatch(ctx, items, fn, guard.BatchOptions{}) {
		if r.Err != nil || !r.Replayed {
			t.Errorf("second batch, item %d = %+v; want a replay", i, r)
		}
	}
	if n := ran.Load(); n != 15 {
		t.Errorf("%d effects ran after the second batch, want 15", n)
	}
}
