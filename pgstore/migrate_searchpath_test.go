package pgstore_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// searchPathDB opens dsn's database with the search_path path.
func searchPathDB(t *testing.T, dsn, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("postgres", testenv.DSNWith(t, dsn, "search_path", path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func currentSchema(t *testing.T, db *sql.DB) string {
	t.Helper()
	var s string
	if err := db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMigrateAgainThroughLaterSearchPathSchema: with Options.Schema empty
// ("the connection's search_path"), tables migrated into a schema that is
// not the first of the search_path (the common "$user", public: tables in
// public, and a schema named after the role created later, or the app's
// role having one while an admin migrated into public) are found by
// Version and by every Store statement. Migrate, "a no-op when run again",
// is not: its CREATE TABLE IF NOT EXISTS of the version table looks only
// in the creation schema (the first of the path), makes an empty version
// table there, which from then on shadows the real one, and applies every
// migration again into that schema. The Store then reads the new, empty
// tables: a key committed before is claimed afresh (its effect runs
// again) instead of replayed.
func TestMigrateAgainThroughLaterSearchPathSchema(t *testing.T) {
	t.Parallel()
	dbA, dsnA := testenv.Postgres(t) // where the tables were migrated
	dbB, _ := testenv.Postgres(t)    // another schema, first in the app's path
	schemaA, schemaB := currentSchema(t, dbA), currentSchema(t, dbB)

	if err := pgstore.Migrate(ctx, dbA, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	sA, err := pgstore.New(dbA, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "s", ID: "paid"}
	req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	out, err := sA.Claim(ctx, req)
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	if err := sA.Complete(ctx, out.Lease, []byte("charged"), time.Hour); err != nil {
		t.Fatal(err)
	}

	// The app's connections: search_path "B, A".
	app := searchPathDB(t, dsnA, `"`+schemaB+`", "`+schemaA+`"`)
	m, err := pgstore.NewMigrator(app, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := m.Version(ctx); err != nil || v != m.Latest() {
		t.Fatalf("Version through the app's search_path = %d, %v; want %d (the tables in %s)", v, err, m.Latest(), schemaA)
	}
	s, err := pgstore.New(app, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	req.Token = "B"
	if out, err := s.Claim(ctx, req); err != nil || out.Status != guard.Replay {
		t.Fatalf("claim before Migrate = %+v, %v; want the replay", out, err)
	}

	// The app starts and migrates, as every deployment does at start:
	// everything is applied already, so this must change nothing.
	if err := pgstore.Migrate(ctx, app, pgstore.Options{}); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	var made int
	if err := dbB.QueryRowContext(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1`, schemaB).Scan(&made); err != nil {
		t.Fatal(err)
	}
	req.Token = "C"
	out, err = s.Claim(ctx, req)
	if made != 0 || err != nil || out.Status != guard.Replay {
		t.Fatalf("after Migrate of up-to-date tables: %d tables made in %s; the committed key's claim = %+v, %v; "+
			"want no table made and the replay of %q", made, schemaB, out, err, "charged")
	}
}
