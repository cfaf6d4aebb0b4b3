package backstop_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapGetBinaryFingerprint: after Redis forgot a key, Get reads the
// fingerprint from PostgreSQL as the caller gave it, whatever its bytes
// (a raw digest): the committed row's and a live mark's, not the form
// the keys table keeps it in (pgstore.StoredText). A reader that compares
// it with the request's (fallback's switch-back check over such a store
// as its secondary) would otherwise call its own retry a mismatch.
func TestWrapGetBinaryFingerprint(t *testing.T) {
	t.Parallel()
	const fp = "\x00\xff\xfe raw digest"
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{})

	for _, committed := range []bool{false, true} {
		key := newKey(t)
		out, err := g.Claim(ctx, key, fp)
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim = %+v, %v", out, err)
		}
		if committed {
			commitFP(t, db, b, out.Lease, fp)
		}
		if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
			t.Fatal(err)
		}
		rec, err := g.Get(ctx, key)
		if err != nil || !rec.SameFingerprint(fp) {
			t.Fatalf("committed %t: Get of a key only PostgreSQL holds = %+v, %v; want fingerprint %q", committed, rec, err, fp)
		}
		if committed {
			continue
		}
		if err := g.Release(ctx, out.Lease); err != nil {
			t.Fatal(err)
		}
	}
}

// commitFP commits l's row with fingerprint fp and an empty result.
func commitFP(t *testing.T, db *sql.DB, b *backstop.Backstop, l guard.Lease, fp string) {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := b.Commit(ctx, tx, l, fp, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestWrapClaimUnreadableFingerprint: the committed row of a key whose
// fingerprint column does not decode is a record PostgreSQL cannot read
// whole: Wrap's Get answers ErrCorrupt when Redis has no record. A claim of the request that
// committed it answered Mismatch (httpx: 422 "key reused with a different
// request"), whether Redis had forgotten the key (the mark found the row)
// or called it exhausted (the row was looked up); now ErrCorrupt too.
func TestWrapClaimUnreadableFingerprint(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	g := guard.New(backstop.Wrap(rs, b), guard.Options{MaxAttempts: 1})
	for _, redis := range []string{"forgot", "exhausted"} {
		t.Run(redis, func(t *testing.T) {
			key := newKey(t)
			out, err := g.Claim(ctx, key, "fp")
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim = %+v, %v", out, err)
			}
			commitFP(t, db, b, out.Lease, "fp")
			if redis == "forgot" {
				err = rdb.Del(ctx, rs.Name(key)).Err()
			} else { // the holder failed its only attempt in Redis alone
				err = rs.Fail(ctx, out.Lease, "boom", time.Hour)
			}
			if err != nil {
				t.Fatal(err)
			}
			pgenv.Exec(t, db, `UPDATE idemguard_keys SET fingerprint = E'\x01%%%' WHERE scope = $1 AND id = $2`, key.Scope, key.ID)
			if _, err := g.Get(ctx, key); redis == "forgot" && !errors.Is(err, guard.ErrCorrupt) {
				t.Fatalf("precondition: Get = %v, want ErrCorrupt", err)
			}
			out, err = g.Claim(ctx, key, "fp")
			if !errors.Is(err, guard.ErrCorrupt) {
				t.Errorf("claim through Wrap of a row whose fingerprint does not decode = %v, %v; want ErrCorrupt", out.Status, err)
			}
		})
	}
}
