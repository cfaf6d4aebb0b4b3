package pgstore_test

import (
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestStoreContract runs the whole contract suite, the 64-goroutine
// one-key race and the 1,000 keys × 8 duplicates race included, on the
// PostgreSQL Store, with leases and retention on the database clock.
func TestStoreContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			return pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
		},
		Advance:              storetest.Wait,
		Parallel:             true,
		FencesOutliveRecords: true, // a released first attempt's row is kept until Purge
	})
}

func TestStoreBadInput(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
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
	if bad, err := pgstore.New(db, pgstore.Options{TablePrefix: string(make([]byte, 60))}); err == nil || bad != nil {
		t.Errorf("New with an invalid prefix = %v, %v; want an error", bad, err)
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
	s := pgenv.Store(t, db, pgstore.Options{})
	_, err = s.Claim(ctx, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "x"}, Token: "A", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Claim on a closed database = %v, want ErrUnavailable", err)
	}
}

// TestReleaseKeepsFenceGrowing: a row whose retention passed starts a
// first attempt with its fence still growing (decide, actReset), so a
// holder from before never passes for a later one. Releasing that first
// attempt must not undo this: deleting the row handed the next claim
// fence 1 again, below the fence of the claim it released and of every
// holder before it.
func TestReleaseKeepsFenceGrowing(t *testing.T) {
	t.Parallel()
	s := pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "release-fence"}
	r := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	claimed := func(tok string) guard.Lease {
		t.Helper()
		r.Token = tok
		out, err := s.Claim(ctx, r)
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("Claim(%s) = %+v, %v; want acquired", tok, out, err)
		}
		return out.Lease
	}
	a := claimed("A")
	if err := s.Complete(ctx, a, []byte("a"), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	storetest.Wait(t, time.Millisecond) // the completed record's retention passes on the database's clock
	b := claimed("B")
	if b.Fence <= a.Fence || b.Attempt != 1 {
		t.Fatalf("claim after retention = %+v, want a first attempt with a fence above %d", b, a.Fence)
	}
	if err := s.Release(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, b); err != nil {
		t.Fatalf("release again = %v", err)
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get after release = %v, want ErrNotFound", err)
	}
	if c := claimed("C"); c.Fence <= b.Fence || c.Attempt != 1 || c.Recovered {
		t.Fatalf("claim after the release = %+v, want a first attempt with a fence above %d", c, b.Fence)
	}
}

// TestLeasesNeverOverlap: holders that fail, release or die (and are
// recovered once their lease ran out on the database's clock) never hold
// the key at once, and fences grow.
func TestLeasesNeverOverlap(t *testing.T) {
	t.Parallel()
	s := pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
	storetest.LeasesNeverOverlap(t, s, 100*time.Millisecond, 16, 3*time.Second)
}
