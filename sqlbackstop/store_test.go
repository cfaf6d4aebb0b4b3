package sqlbackstop_test

import (
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/sqlbackstop"
)

// TestStoreContract runs the whole contract suite, the 64-goroutine
// one-key race and the 1,000 keys × 8 duplicates race included, on the
// PostgreSQL Store, with leases and retention on the database clock.
func TestStoreContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			return sqlbackstop.NewStore(migrated(t, sqlbackstop.Options{}), sqlbackstop.Options{})
		},
		Advance: storetest.Wait,
	})
}

// TestGuardedContract: a Redis store wrapped by Guarded is still a valid
// Store (the many-keys race is smaller: each claim also writes a mark).
func TestGuardedContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			rs := guard.NewRedisStore(testenv.Redis(t), guard.RedisOptions{Prefix: testenv.Prefix(t)})
			return sqlbackstop.Guarded(rs, sqlbackstop.New(migrated(t, sqlbackstop.Options{}), sqlbackstop.Options{}))
		},
		Advance:    storetest.Wait,
		Keys:       100,
		Duplicates: 4,
	})
}

func TestStoreBadInput(t *testing.T) {
	t.Parallel()
	db := migrated(t, sqlbackstop.Options{})
	s := sqlbackstop.NewStore(db, sqlbackstop.Options{})
	key := guard.Key{Scope: "s", ID: "bad-input"}
	good := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	for name, mod := range map[string]func(*guard.ClaimRequest){
		"empty id":     func(r *guard.ClaimRequest) { r.Key.ID = "" },
		"control char": func(r *guard.ClaimRequest) { r.Key.ID = "a\x00b" },
		"no token":     func(r *guard.ClaimRequest) { r.Token = "" },
		"zero lease":   func(r *guard.ClaimRequest) { r.Lease = 0 },
		"zero ttl":     func(r *guard.ClaimRequest) { r.TTL = 0 },
		"negative max": func(r *guard.ClaimRequest) { r.MaxAttempts = -1 },
	} {
		r := good
		mod(&r)
		if _, err := s.Claim(ctx, r); err == nil {
			t.Errorf("%s: Claim succeeded", name)
		}
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("bad claims left a record: %v", err)
	}
	if err := s.Extend(ctx, guard.Lease{Key: key, Token: "A"}, 0); err == nil {
		t.Error("Extend with zero lease succeeded")
	}
	if err := s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, nil, 0); err == nil {
		t.Error("Complete with zero ttl succeeded")
	}
	bad := sqlbackstop.NewStore(db, sqlbackstop.Options{TablePrefix: string(make([]byte, 60))})
	if _, err := bad.Claim(ctx, good); err == nil {
		t.Error("a store with an invalid prefix claimed")
	}
}

// TestStoreUnavailable: a database that cannot be reached is ErrUnavailable.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	dsn := fmt.Sprintf("postgres://nobody@127.0.0.1:%d/none?sslmode=disable&connect_timeout=2", testenv.FreePort(t))
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s := sqlbackstop.NewStore(db, sqlbackstop.Options{})
	_, err = s.Claim(ctx, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "x"}, Token: "A", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Claim on a closed database = %v, want ErrUnavailable", err)
	}
}

// TestStoreFenceGrowsPastRetention: a key claimed again after its record
// expired starts at attempt 1, but with a fence above the old one, so the
// old holder's late Commit is stale.
func TestStoreFenceGrowsPastRetention(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	db := migrated(t, sqlbackstop.Options{})
	businessTable(t, db)
	s := sqlbackstop.NewStore(db, sqlbackstop.Options{})
	b := sqlbackstop.New(db, sqlbackstop.Options{})
	key := guard.Key{Scope: "s", ID: "retained"}
	req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: ttl, TTL: ttl}
	a, err := s.Claim(ctx, req)
	if err != nil || a.Status != guard.Acquired || a.Lease.Fence != 1 {
		t.Fatalf("first claim = %+v, %v", a, err)
	}
	time.Sleep(ttl + 50*time.Millisecond) // waiting for the record's retention to pass
	req.Token = "B"
	bo, err := s.Claim(ctx, req)
	if err != nil || bo.Status != guard.Acquired || bo.Lease.Attempt != 1 || bo.Lease.Recovered || bo.Lease.Fence != 2 {
		t.Fatalf("claim after retention = %+v, %v; want attempt 1, fence 2", bo.Lease, err)
	}
	if err := pay(t, db, b, a.Lease, "A"); !errors.Is(err, sqlbackstop.ErrStaleFence) {
		t.Fatalf("old holder's commit = %v, want ErrStaleFence", err)
	}
}
