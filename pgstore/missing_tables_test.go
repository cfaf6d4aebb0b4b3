package pgstore_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// A Store on tables that were never created (a schema, or a TablePrefix,
// never migrated) answers with the server's undefined_table error,
// classified as before (not unavailable), and says to run pgstore.Migrate.
func TestMissingTablesSayMigrate(t *testing.T) {
	t.Parallel()
	bare, _ := testenv.Postgres(t)                   // search_path: a schema of its own, empty
	migrated := pgenv.Migrated(t, pgstore.Options{}) // the default prefix only
	for name, s := range map[string]*pgstore.Store{
		"schema never migrated": pgenv.Store(t, bare, pgstore.Options{}),
		"prefix never migrated": pgenv.Store(t, migrated, pgstore.Options{TablePrefix: "never_migrated_"}),
		"schema that is absent": pgenv.Store(t, migrated, pgstore.Options{Schema: "absent_schema"}),
	} {
		key := guard.Key{Scope: "s", ID: "missing-tables"}
		_, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		pgenv.WantMissingTable(t, name+": Claim", err)
		_, err = s.Get(ctx, key)
		pgenv.WantMissingTable(t, name+": Get", err)
		lease := guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}
		pgenv.WantMissingTable(t, name+": Complete", s.Complete(ctx, lease, []byte("r"), time.Hour))
		pgenv.WantMissingTable(t, name+": Extend", s.Extend(ctx, lease, time.Minute))
		_, err = s.Consume(ctx, "group", "m1", func(context.Context, *sql.Tx) error { return nil })
		pgenv.WantMissingTable(t, name+": Consume", err)
		_, err = s.Purge(ctx, pgstore.PurgeOptions{})
		pgenv.WantMissingTable(t, name+": Purge", err)
	}
}
