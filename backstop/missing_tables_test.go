package backstop_test

import (
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// A Backstop on tables that were never created (a schema, or a
// TablePrefix, never migrated) answers Commit and Lookup with the server's
// undefined_table error, classified as before (not unavailable), and says
// to run pgstore.Migrate.
func TestMissingTablesSayMigrate(t *testing.T) {
	bare, _ := testenv.Postgres(t) // search_path: a schema of its own, empty
	migrated := pgenv.Migrated(t, pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "missing-tables"}
	for name, b := range map[string]*backstop.Backstop{
		"schema never migrated": mustBackstop(t, bare, pgstore.Options{}),
		"prefix never migrated": mustBackstop(t, migrated, pgstore.Options{TablePrefix: "never_migrated_"}),
		"schema that is absent": mustBackstop(t, migrated, pgstore.Options{Schema: "absent_schema"}),
	} {
		tx, err := b.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = b.Commit(ctx, tx, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}, "fp", []byte("r"))
		_ = tx.Rollback()
		pgenv.WantMissingTable(t, name+": Commit", err)
		_, _, _, err = b.Lookup(ctx, key)
		pgenv.WantMissingTable(t, name+": Lookup", err)
	}
}
