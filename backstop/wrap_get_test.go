package backstop_test

import (
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapGetCommittedKeepsFingerprint: after Redis forgot a committed
// key, Get reads the committed row, fingerprint included, as Redis's own
// record of it would be: a reader that compares the request's fingerprint
// (fallback's switch-back check, over such a store as its secondary)
// replays the key instead of calling it a mismatch.
func TestWrapGetCommittedKeepsFingerprint(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{})
	key := newKey(t)
	out, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if err := pay(t, db, b, out.Lease, "receipt"); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
		t.Fatal(err)
	}
	rec, err := g.Get(ctx, key)
	if err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "receipt" || !rec.SameFingerprint("fp") {
		t.Fatalf("Get of a key only the committed row holds = %+v, %v; want completed, its result and fingerprint", rec, err)
	}
}
