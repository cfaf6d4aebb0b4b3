package pgstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv/pgenv"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

func tableExists(t *testing.T, db *sql.DB, name string) bool {
	t.Helper()
	var reg sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT to_regclass($1)::text`, name).Scan(&reg); err != nil {
		t.Fatal(err)
	}
	return reg.Valid
}

var allTables = []string{"idemguard_keys", "idemguard_consumed_messages", "idemguard_webhook_deliveries", "idemguard_steps", "idemguard_schema_migrations"}

// TestMigrateUpDownUp: up, up again (a no-op), down, up on a database in
// use; the Store works after each up.
func TestMigrateUpDownUp(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	opts := pgstore.Options{}
	m, err := pgstore.NewMigrator(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Version(ctx); err != nil || v != 0 {
		t.Fatalf("version of an empty database = %d, %v", v, err)
	}
	if err := pgstore.Migrate(ctx, db, opts); err != nil {
		t.Fatalf("up: %v", err)
	}
	if v, _ := m.Version(ctx); v != m.Latest() || v != 5 {
		t.Fatalf("version after up = %d, want %d", v, m.Latest())
	}
	var applied1 string
	mustQuery := func(q string, dest ...any) {
		t.Helper()
		if err := db.QueryRowContext(ctx, q).Scan(dest...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustQuery(`SELECT string_agg(version || ':' || applied_at, ',' ORDER BY version) FROM idemguard_schema_migrations`, &applied1)

	// Use it: a record that must survive the second up.
	s := pgenv.Store(t, db, opts)
	key := guard.Key{Scope: "s", ID: "kept"}
	req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	if _, err := s.Claim(ctx, req); err != nil {
		t.Fatal(err)
	}

	if err := pgstore.Migrate(ctx, db, opts); err != nil {
		t.Fatalf("second up: %v", err)
	}
	var applied2 string
	mustQuery(`SELECT string_agg(version || ':' || applied_at, ',' ORDER BY version) FROM idemguard_schema_migrations`, &applied2)
	if applied1 != applied2 {
		t.Fatalf("second up changed the version table: %s → %s", applied1, applied2)
	}
	if rec, err := s.Get(ctx, key); err != nil || rec.Token != "A" {
		t.Fatalf("record after second up = %+v, %v", rec, err)
	}

	// Down with the Store's connections open.
	if err := pgstore.MigrateDown(ctx, db, opts); err != nil {
		t.Fatalf("down: %v", err)
	}
	for _, tb := range allTables {
		if tableExists(t, db, tb) {
			t.Fatalf("table %s exists after down", tb)
		}
	}
	if _, err := s.Get(ctx, key); err == nil || errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get without tables = %v, want a database error", err)
	}
	if err := pgstore.MigrateDown(ctx, db, opts); err != nil {
		t.Fatalf("second down: %v", err)
	}

	if err := pgstore.Migrate(ctx, db, opts); err != nil {
		t.Fatalf("up after down: %v", err)
	}
	for _, tb := range allTables {
		if !tableExists(t, db, tb) {
			t.Fatalf("table %s missing after up", tb)
		}
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get after down+up = %v, want ErrNotFound", err)
	}
	if out, err := s.Claim(ctx, req); err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim after down+up = %+v, %v", out, err)
	}
}

func TestMigrateSteps(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	m, err := pgstore.NewMigrator(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	version := func() int {
		v, err := m.Version(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if err := m.Steps(ctx, 1); err != nil || version() != 1 || !tableExists(t, db, "idemguard_keys") || tableExists(t, db, "idemguard_consumed_messages") {
		t.Fatalf("after 1 step up: version %d, %v", version(), err)
	}
	if err := m.Steps(ctx, 6); err == nil || version() != 5 {
		t.Fatalf("6 steps from 1 = %v at version %d, want an error at 5", err, version())
	}
	if err := m.Steps(ctx, -4); err != nil || version() != 1 || tableExists(t, db, "idemguard_webhook_deliveries") || tableExists(t, db, "idemguard_steps") {
		t.Fatalf("4 steps down: version %d, %v", version(), err)
	}
	if err := m.Steps(ctx, -1); err != nil || version() != 0 || tableExists(t, db, "idemguard_keys") {
		t.Fatalf("last step down: version %d, %v", version(), err)
	}
	if err := m.Steps(ctx, -1); err == nil {
		t.Fatal("a step down from version 0 succeeded")
	}
}

// TestMigrateConcurrent: migrators started together take turns.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
				t.Errorf("concurrent Migrate: %v", err)
			}
		}()
	}
	wg.Wait()
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_schema_migrations`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("versions recorded = %d, %v; want 5", n, err)
	}
}

// TestMigrateConcurrentStrictIsolation: migrators in several processes
// (pools of their own) started together on a database whose default
// isolation is REPEATABLE READ or SERIALIZABLE (a DBA's choice for the
// business tables) take turns too. Each step's transaction took its
// snapshot with the statement that waited for the advisory lock, so the
// migrators that waited read the versions as they were before the first
// one committed, and failed applying migration 1 again ("relation
// idemguard_keys already exists").
func TestMigrateConcurrentStrictIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			direct, dsn := testenv.Postgres(t)
			var wg sync.WaitGroup
			for range 4 {
				db, err := sql.Open("postgres", testenv.DSNWithIsolation(t, dsn, level))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.Close() })
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
						t.Errorf("concurrent Migrate at %s: %v", level, err)
					}
				}()
			}
			wg.Wait()
			var n int
			if err := direct.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_schema_migrations`).Scan(&n); err != nil || n != 5 {
				t.Fatalf("versions recorded = %d, %v; want 5", n, err)
			}
		})
	}
}

// TestMigrateConcurrentPrefixesNewSchema: migrators of several table
// prefixes in one schema that does not exist yet, started together (two
// services deployed at once on a new database), all succeed. Each took
// only its own prefix's lock, so their CREATE SCHEMA IF NOT EXISTS ran at
// once, and all but one failed on PostgreSQL's catalog (23505, duplicate
// key in pg_namespace_nspname_index).
func TestMigrateConcurrentPrefixesNewSchema(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	for round := range 8 {
		schema := "new_schema_" + strings.ToLower(rand.Text()[:8])
		t.Cleanup(func() { _, _ = db.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+pq.QuoteIdentifier(schema)+` CASCADE`) })
		var wg sync.WaitGroup
		for p := range 3 {
			wg.Go(func() {
				opts := pgstore.Options{Schema: schema, TablePrefix: "p" + strconv.Itoa(p) + "_"}
				if err := pgstore.Migrate(ctx, db, opts); err != nil {
					t.Errorf("round %d, prefix %s: Migrate: %v", round, opts.TablePrefix, err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
	}
}

// TestMigrateOddNames: a schema and prefix that need quoting work end to
// end, and the SQL never splices them unquoted.
func TestMigrateOddNames(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	schema := `odd "schema"; ` + strings.ToLower(rand.Text()[:6])
	t.Cleanup(func() { _, _ = db.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+pq.QuoteIdentifier(schema)+` CASCADE`) })
	opts := pgstore.Options{Schema: schema, TablePrefix: `P-x"; DROP TABLE y; `}
	if err := pgstore.Migrate(ctx, db, opts); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema).Scan(&n); err != nil || n != 5 {
		t.Fatalf("tables in %q = %d, %v; want 5", schema, n, err)
	}
	s := pgenv.Store(t, db, opts)
	key := guard.Key{Scope: "s", ID: "x"}
	if out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	if err := pgstore.MigrateDown(ctx, db, opts); err != nil {
		t.Fatalf("MigrateDown: %v", err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("tables in %q after down = %d, %v; want 0", schema, n, err)
	}
}

func TestOptionsValidate(t *testing.T) {
	t.Parallel()
	for _, o := range []pgstore.Options{
		{TablePrefix: strings.Repeat("p", 40)},
		{Schema: strings.Repeat("s", 64)},
		{Schema: "a\x00b"},
		{TablePrefix: "a\x00"},
	} {
		if err := o.Validate(); err == nil {
			t.Errorf("Validate(%q, %q) = nil", o.Schema, o.TablePrefix)
		}
		if _, err := pgstore.NewMigrator(&sql.DB{}, o); err == nil {
			t.Errorf("NewMigrator(%q, %q) = nil error", o.Schema, o.TablePrefix)
		}
	}
	if err := (pgstore.Options{}).Validate(); err != nil {
		t.Errorf("zero Options: %v", err)
	}
	for name, f := range map[string]func() error{
		"NewMigrator": func() error { _, err := pgstore.NewMigrator(nil, pgstore.Options{}); return err },
		"New":         func() error { _, err := pgstore.New(nil, pgstore.Options{}); return err },
		"Migrate":     func() error { return pgstore.Migrate(context.Background(), nil, pgstore.Options{}) },
	} {
		if err := f(); err == nil {
			t.Errorf("%s(nil db) = nil error", name)
		}
	}
}

// TestMigrateDownNeverMigratedLeavesNothing: undoing the migrations of
// tables never migrated (Down, MigrateDown, Steps with a negative n: a
// mistyped schema, a cleanup run twice) makes nothing. Down created the
// schema the Options name (and the version table, which it then dropped)
// before finding nothing to undo, and a step down left both: a schema
// where nothing was ever migrated.
func TestMigrateDownNeverMigratedLeavesNothing(t *testing.T) {
	t.Parallel()
	db, _ := testenv.Postgres(t)
	absent := "never_" + strings.ToLower(rand.Text()[:8])
	t.Cleanup(func() { _, _ = db.ExecContext(ctx, `DROP SCHEMA IF EXISTS `+pq.QuoteIdentifier(absent)+` CASCADE`) })
	schemaExists := func() bool {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, absent).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	for _, opts := range []pgstore.Options{{Schema: absent}, {}, {TablePrefix: "other_"}} {
		m, err := pgstore.NewMigrator(db, opts)
		if err != nil {
			t.Fatal(err)
		}
		leftNothing := func(what string) {
			t.Helper()
			if schemaExists() || tableExists(t, db, "idemguard_schema_migrations") || tableExists(t, db, "other_schema_migrations") {
				t.Fatalf("%+v: %s of tables never migrated left the schema %q or a version table", opts, what, absent)
			}
		}
		if err := m.Down(ctx); err != nil {
			t.Errorf("%+v: Down of tables never migrated = %v", opts, err)
		}
		leftNothing("Down")
		if err := pgstore.MigrateDown(ctx, db, opts); err != nil {
			t.Errorf("%+v: MigrateDown of tables never migrated = %v", opts, err)
		}
		leftNothing("MigrateDown")
		if err := m.Steps(ctx, -1); err == nil {
			t.Errorf("%+v: a step down of tables never migrated succeeded", opts)
		}
		leftNothing("a step down")
	}
}
