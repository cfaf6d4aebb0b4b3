package pgstore

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"testing"
)

// TestAppliedMigrationsUnchanged: a migration that databases have applied
// is never rewritten (they would not run it again), and the names that
// find their state (the schema-version table, the advisory-lock key) stay
// those sqlbackstop used, so databases migrated before the package moved
// are at the version they were. A schema change is a new migration, with
// the next number; add its digests here once it has shipped.
func TestAppliedMigrationsUnchanged(t *testing.T) {
	shipped := map[string]string{
		"migrations/0001_keys.up.sql":                 "545b3daa09cc71c3b7f5c9e800ea74e5584278bf7dd3df3407f887c7e0bbb619",
		"migrations/0001_keys.down.sql":               "d76334e270e267dd8ec8c1495ca27a0fcc54fac68d30491b770ce71bce6b14ce",
		"migrations/0002_consumed_messages.up.sql":    "97f729676743e9eb4226b69c1c2216e8d81ac3846c9d63b8c6f5ae12bc11dc07",
		"migrations/0002_consumed_messages.down.sql":  "0e0dcb606653e887b8d320903a530dd5513d923e15aa6536298ae19429904de0",
		"migrations/0003_webhook_deliveries.up.sql":   "530454b17b10fd7fbf08443cf338b1b1d3ad81f4c1926c2e431d64464e0baef3",
		"migrations/0003_webhook_deliveries.down.sql": "adc564f5efcdfba1accd020cd7f95b9271db8741b81aa6a4e0949ea42aae6034",
		"migrations/0004_steps.up.sql":                "c255321f2e6f918233c9bbefebfd1942a95f37e882644427d7a79cc830be22e9",
		"migrations/0004_steps.down.sql":              "ddb9c8183cfaf68d55e853e60be6fc2905cdf7f5c108921d1601cfaf626d5b5c",
	}
	for file, want := range shipped {
		b, err := fs.ReadFile(migrationFiles, file)
		if err != nil {
			t.Errorf("%s: %v (a shipped migration must stay)", file, err)
			continue
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s was rewritten (sha256 %s, shipped %s): add a new migration instead", file, got, want)
		}
	}
	tb := newTables(Options{})
	if tb.Versions != `"idemguard_schema_migrations"` || tb.LockKey != "idemguard:.idemguard_" || tb.Keys != `"idemguard_keys"` {
		t.Errorf("default names changed: versions %s, lock %q, keys %s", tb.Versions, tb.LockKey, tb.Keys)
	}
	ts := newTables(Options{Schema: `od"d`, TablePrefix: "p_"})
	if ts.Versions != `"od""d"."p_schema_migrations"` || ts.LockKey != `idemguard:od"d.p_` {
		t.Errorf("names in a schema changed: versions %s, lock %q", ts.Versions, ts.LockKey)
	}
}
