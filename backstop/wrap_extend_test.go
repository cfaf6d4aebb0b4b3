package backstop_test

import (
	"database/sql"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapExtendKeepsMark: a holder that extends its lease (KeepAlive
// does, every third of a lease, up to MaxRun) keeps its mark in
// PostgreSQL for as long as it holds the key, however short the
// backstop's TTL. Otherwise, once the mark outlived max(TTL, lease) and
// Redis then forgot the key, a request with another payload took the key
// from the running holder (whose Commit then failed as a mismatch)
// instead of being refused as one.
func TestWrapExtendKeepsMark(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	opts := pgstore.Options{TTL: 200 * time.Millisecond}
	b := mustBackstop(t, db, opts)
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	s := backstop.Wrap(rs, b)
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "extend", true: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			extendKeepsMark(t, db, rdb, rs, s, batch)
		})
	}
}

func extendKeepsMark(t *testing.T, db *sql.DB, rdb *redis.Client, rs *guard.RedisStore, s guard.Store, batch bool) {
	key := newKey(t)
	extend := func(l guard.Lease, d time.Duration) error {
		if !batch {
			return s.Extend(ctx, l, d)
		}
		return s.(guard.BatchStore).WriteBatch(ctx, []guard.Write{{Kind: guard.WriteExtend, Lease: l, TTL: d}})[0]
	}
	req := func(tok, fp string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: 500 * time.Millisecond, TTL: time.Minute, MaxAttempts: 3}
	}
	out, err := s.Claim(ctx, req("A", "fp-a"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim A = %s, %v", out.Status, err)
	}
	a := out.Lease
	// A keeps extending its lease while it runs, well past the mark's
	// first retention.
	markGone := func() bool {
		var live bool
		if err := db.QueryRowContext(ctx, `SELECT expires_at > clock_timestamp() FROM idemguard_keys WHERE id = $1`, key.ID).Scan(&live); err != nil {
			t.Fatal(err)
		}
		return !live
	}
	start := time.Now()
	for time.Since(start) < 1500*time.Millisecond {
		if err := extend(a, 500*time.Millisecond); err != nil {
			t.Fatalf("extend A: %v", err)
		}
		if markGone() {
			break
		}
		time.Sleep(50 * time.Millisecond) // the holder's heartbeat, not synchronisation
	}
	if err := extend(a, 30*time.Second); err != nil {
		t.Fatalf("extend A: %v", err)
	}
	if markGone() {
		t.Errorf("A's mark expired while A held the key")
	}
	// Redis forgets the key (a failover that lost it, FLUSHALL).
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
		t.Fatal(err)
	}
	out, err = s.Claim(ctx, req("B", "fp-b"))
	if err != nil || out.Status != guard.Mismatch {
		t.Fatalf("claim with another payload while A holds the key = %s (token %q fence %d), %v; want Mismatch", out.Status, out.Lease.Token, out.Lease.Fence, err)
	}
}
