package backstop_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestReleasedLaterAttemptMarkKeptAsTheStoresRecord: 8e1dc25
// made unmark keep every ended mark for "the TTL from then, as the store
// keeps the failed record". That holds for Fail (fail.lua: SET ... PX
// ttl; pgstore fail: expires_at = now + ttl) but not for the Release of
// a later attempt (or of one with steps): release.lua returns the record
// to failed with KEEPTTL, and pgstore's releaseLater leaves expires_at,
// so the store keeps it to the old lease's end + TTL, as the mark was
// kept before 8e1dc25. Now the mark expires up to a lease earlier than
// the store's record. Redis then forgets the key (failover, FLUSHALL:
// what the backstop is for): a request with another payload, which the
// store would still refuse (Mismatch, 422), is granted by the backstop
// whose mark should answer as the store would.
func TestReleasedLaterAttemptMarkKeptAsTheStoresRecord(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{TTL: ttl})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	s := backstop.Wrap(rs, b)
	key := newKey(t)
	claim := func(tok, fp string, lease time.Duration) guard.Outcome {
		t.Helper()
		out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: lease, TTL: ttl, MaxAttempts: 5})
		if err != nil {
			t.Fatalf("claim %s: %v", tok, err)
		}
		return out
	}
	// Attempt 1 of payload B fails.
	out := claim("B1", "B", 100*time.Millisecond)
	if out.Status != guard.Acquired {
		t.Fatalf("B1: %v", out.Status)
	}
	if err := s.Fail(ctx, out.Lease, "declined", ttl); err != nil {
		t.Fatal(err)
	}
	// Attempt 2 (a 20 s lease) is released at once (an httpx 503: not done,
	// try again).
	out = claim("B2", "B", 20*time.Second)
	if out.Status != guard.Acquired || out.Lease.Attempt != 2 {
		t.Fatalf("B2: %v attempt %d", out.Status, out.Lease.Attempt)
	}
	if err := s.Release(ctx, out.Lease); err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl + 700*time.Millisecond)

	// The store still keeps B's failed record (KEEPTTL: the lease's end
	// and the TTL after it) and refuses payload A.
	rec, err := rs.Get(ctx, key)
	if err != nil || rec.State != guard.StateFailed {
		t.Fatalf("Redis's record %+v, %v; want B's failed record kept", rec, err)
	}
	if out := claim("A1", "A", 10*time.Second); out.Status != guard.Mismatch {
		t.Fatalf("with Redis's record: payload A = %v; want Mismatch", out.Status)
	}
	// Redis forgets the key: the backstop answers for it.
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
		t.Fatal(err)
	}
	if out := claim("A2", "A", 10*time.Second); out.Status != guard.Mismatch {
		t.Errorf("after Redis lost the key: payload A = %v; want Mismatch, as the store (which keeps the released attempt's failed record to the lease's end + TTL) would answer: the mark expired the TTL after the release", out.Status)
	}
}
