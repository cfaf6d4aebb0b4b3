package pgstore_test

import (
	"sync"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestMigratorsNamingSchemaTwoWaysTakeTurns: two migrators of the
// same tables, one naming their schema (Options.Schema, as a service
// configured with it does) and one through the search_path (Schema "",
// as `idemguard migrate` without --schema or another service does),
// started together on a new database. "Concurrent migrators take turns"
// (Migrator's doc), but their advisory-lock keys differ
// ("idemguard:S.idemguard_" and "idemguard:.idemguard_"): both apply
// migration 1 at once, and one fails.
func TestMigratorsNamingSchemaTwoWaysTakeTurns(t *testing.T) {
	t.Parallel()
	for round := range 6 {
		db, _ := testenv.Postgres(t) // search_path: a fresh schema of its own
		schema := currentSchema(t, db)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, opts := range []pgstore.Options{{Schema: schema}, {}} {
			wg.Go(func() { errs[i] = pgstore.Migrate(ctx, db, opts) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: Migrate naming the schema %v: %v", round, i == 0, err)
			}
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_schema_migrations`).Scan(&n); err != nil || n != 5 {
			t.Fatalf("round %d: versions = %d, %v", round, n, err)
		}
	}
}
