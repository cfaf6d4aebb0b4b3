package pgstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestOldSchemaSaysMigrate: tables migrated by an older release (before
// migration 5 added the ptok column) fail the statements that need the
// new column with a plain error that says to migrate, not a bare
// "column does not exist".
func TestOldSchemaSaysMigrate(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	m, err := pgstore.NewMigrator(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Steps(ctx, 4); err != nil {
		t.Fatal(err)
	}
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "old"}, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	a, err := s.Claim(ctx, r)
	if err != nil || a.Status != guard.Acquired {
		t.Fatalf("claim of a new key = %+v, %v", a, err)
	}
	if err := s.Fail(ctx, a.Lease, "boom", time.Hour); err != nil {
		t.Fatal(err)
	}
	r.Token = "B"
	_, err = s.Claim(ctx, r)
	if err == nil || !strings.Contains(err.Error(), "pgstore.Migrate") {
		t.Fatalf("claim that needs migration 5 on tables at version 4 = %v; want an error saying to migrate", err)
	}
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if out, err := s.Claim(ctx, r); err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 2 {
		t.Fatalf("the claim after migrating = %+v, %v; want attempt 2", out, err)
	}
}
