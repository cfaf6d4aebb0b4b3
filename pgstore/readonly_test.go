package pgstore_test

import (
	"database/sql"
	"testing"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestVersionOnlyReads: Migrator.Version reads the schema version and
// writes nothing. It created the schema and the version table it reads
// in a read-write transaction, so it left a version table, or a whole
// schema, where nothing was migrated (this test fails so without the
// fix, on the read-only session too: lib/pq begins every transaction
// READ WRITE, which overrides default_transaction_read_only), and on a
// hot standby it failed at once ("cannot set transaction read-write mode
// during recovery", SQLSTATE 0A000; seen on a private primary and
// standby pair). Nothing migrated is version 0 without an error
// (versions start at 1).
func TestVersionOnlyReads(t *testing.T) {
	t.Parallel()
	rw, dsn := testenv.Postgres(t)
	ro := pgenv.ReadOnly(t, dsn)
	absent := "absent_" + t.Name()
	t.Cleanup(func() { _, _ = rw.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+pq.QuoteIdentifier(absent)+` CASCADE`) })
	schemaExists := func() bool {
		var n int
		if err := rw.QueryRowContext(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, absent).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	version := func(db *sql.DB, opts pgstore.Options) (int, error) {
		m, err := pgstore.NewMigrator(db, opts)
		if err != nil {
			t.Fatal(err)
		}
		return m.Version(ctx)
	}

	for name, db := range map[string]*sql.DB{"read-only": ro, "writable": rw} {
		for _, opts := range []pgstore.Options{{}, {Schema: absent}, {TablePrefix: "other_"}} {
			if v, err := version(db, opts); v != 0 || err != nil {
				t.Errorf("%s, %+v, nothing migrated: Version = %d, %v; want 0, nil", name, opts, v, err)
			}
		}
	}
	if tableExists(t, rw, "idemguard_schema_migrations") || tableExists(t, rw, "other_schema_migrations") || schemaExists() {
		t.Fatal("Version made the version table or the schema it reads")
	}

	if err := pgstore.Migrate(ctx, rw, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	m, err := pgstore.NewMigrator(ro, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Version(ctx); v != m.Latest() || err != nil {
		t.Fatalf("read-only, migrated: Version = %d, %v; want %d", v, err, m.Latest())
	}
	if err := pgstore.MigrateDown(ctx, rw, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	if v, err := m.Version(ctx); v != 0 || err != nil {
		t.Fatalf("read-only, migrated down: Version = %d, %v; want 0, nil", v, err)
	}
}
