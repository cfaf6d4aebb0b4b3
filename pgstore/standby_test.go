package pgstore_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestHotStandbyUnavailable: on a real hot standby (a private primary and
// a standby made from it with pg_basebackup) every write pgstore makes is
// guard.ErrUnavailable, "retry later" (the connections may reach a
// promoted primary after a failover), and nothing runs or changes. lib/pq
// begins every transaction READ WRITE, which a server in recovery refuses
// with SQLSTATE 0A000 (feature_not_supported, "cannot set transaction
// read-write mode during recovery"), not the 25006 a write in a
// read-only transaction gets: Consume, Migrate and MigrateDown returned
// it as a plain error (a consumer dead-lettered or dropped the message,
// a fallback's breaker did not count it).
func TestHotStandbyUnavailable(t *testing.T) {
	t.Parallel()
	pair := pgenv.StartStandby(t)
	if err := pgstore.Migrate(ctx, pair.Primary, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	pair.Replayed(t)
	s := pgenv.Store(t, pair.Standby, pgstore.Options{})
	wantUnavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, guard.ErrUnavailable) || !strings.Contains(err.Error(), "recovery") {
			t.Errorf("%s on a hot standby = %v; want guard.ErrUnavailable naming the recovery", what, err)
		}
	}

	ran, err := s.Consume(ctx, "g", "m1", func(context.Context, *sql.Tx) error {
		t.Error("the handler ran on a hot standby")
		return nil
	})
	if ran {
		t.Error("Consume reported a run")
	}
	wantUnavailable("Consume", err)
	wantUnavailable("Migrate", pgstore.Migrate(ctx, pair.Standby, pgstore.Options{Schema: "other"}))
	wantUnavailable("MigrateDown", pgstore.MigrateDown(ctx, pair.Standby, pgstore.Options{}))
	_, err = s.Claim(ctx, guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "k"}, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("Claim on a hot standby = %v; want guard.ErrUnavailable", err)
	}

	// The standby still reads: the schema is as the primary migrated it.
	m, err := pgstore.NewMigrator(pair.Standby, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Version(ctx); v != m.Latest() || err != nil {
		t.Fatalf("Version on the standby = %d, %v; want %d", v, err, m.Latest())
	}
}
