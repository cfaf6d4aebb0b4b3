package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestCommandsTakeTheTablePrefix: a
// pgstore.Store or backstop given Options.TablePrefix whose tables are
// missing (or migrated by an older release) fails every call saying
// "create the tables with pgstore.Migrate or the command idemguard
// migrate up, given the same Schema and TablePrefix". The command took no
// table prefix: migrate made the default idemguard_* tables beside the
// ones the store wanted (its calls went on failing), and purge and
// inspect --postgres could not reach those tables at all (purge failed;
// inspect read the default tables, and could say "no row" for a key whose
// row exists). Expected: migrate, purge and inspect take --table-prefix.
func TestCommandsTakeTheTablePrefix(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	opts := pgstore.Options{TablePrefix: "shop_"}
	store, err := pgstore.New(db, opts)
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "POST /orders", ID: "o-1"}
	req := guard.ClaimRequest{Key: key, Token: "T1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	_, err = store.Claim(ctx, req)
	if err == nil || !strings.Contains(err.Error(), "idemguard migrate up, given the same Schema and TablePrefix") {
		t.Fatalf("a claim on tables never migrated: %v; want the hint naming idemguard migrate", err)
	}

	// What the hint says to do.
	code, out, stderr := cli(t, "migrate", "--postgres", dsn, "--table-prefix", "shop_", "up")
	if code != 0 {
		t.Fatalf("migrate --table-prefix shop_ up: exit %d: %s%s", code, out, stderr)
	}
	if _, err := store.Claim(ctx, req); err != nil {
		t.Fatalf("the claim after the migration the hint asked for: %v", err)
	}
	code, out, stderr = cli(t, "inspect", "--redis", testenv.RedisAddr(t), "--prefix", testenv.Prefix(t),
		"--postgres", dsn, "--table-prefix", "shop_", key.Scope, key.ID)
	if code != 0 || !strings.Contains(out, "state        pending") {
		t.Errorf("inspect --postgres --table-prefix of the pending row: exit %d:\n%s%s", code, out, stderr)
	}

	// An expired row of those tables is purged by the command.
	g := guard.New(store, guard.Options{TTL: 50 * time.Millisecond, Lease: time.Second})
	if _, err := g.Do(ctx, guard.Key{Scope: "x", ID: "old"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return []byte("r"), nil
	}); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the row to expire", func() bool {
		var live int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM shop_keys WHERE scope = 'x' AND expires_at > now()`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		return live == 0
	})
	code, out, stderr = cli(t, "purge", "--postgres", dsn, "--table-prefix", "shop_")
	if code != 0 || !strings.Contains(out, "purged 1 expired rows") {
		t.Errorf("purge --table-prefix shop_: exit %d: %s%s", code, out, stderr)
	}
	// Nothing was made under the default names.
	var stray int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_tables WHERE tablename LIKE 'idemguard\_%' AND schemaname = current_schema()`).Scan(&stray); err != nil {
		t.Fatal(err)
	}
	if stray != 0 {
		t.Errorf("%d idemguard_* tables made beside the shop_ ones", stray)
	}
}
