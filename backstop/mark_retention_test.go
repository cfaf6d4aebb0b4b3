package backstop_test

import (
	"crypto/rand"
	"errors"
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

// How long a mark is kept beside the store's record: for the lease's
// end as last extended and the TTL after it, and after a Fail for the
// TTL from it, as the stores keep theirs (docs/design.md, the
// backstop). Each test has Redis forget the key, or waits for it to,
// and asks the mark what the store would have answered.

// markEnv is backstop.Wrap of a Redis store over a backstop of TTL ttl,
// on the test's services.
type markEnv struct {
	t   *testing.T
	ttl time.Duration
	s   guard.Store
	rs  *guard.RedisStore
	rdb *redis.Client
}

func newMarkEnv(t *testing.T, ttl time.Duration) *markEnv {
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{TTL: ttl})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	return &markEnv{t: t, ttl: ttl, s: backstop.Wrap(rs, b), rs: rs, rdb: rdb}
}

// claim claims key with token and fingerprint fp for lease.
func (m *markEnv) claim(key guard.Key, token, fp string, lease time.Duration, maxAttempts int) guard.Outcome {
	m.t.Helper()
	out, err := m.s.Claim(ctx, guard.ClaimRequest{Key: key, Token: token, Fingerprint: fp, Lease: lease, TTL: m.ttl, MaxAttempts: maxAttempts})
	if err != nil {
		m.t.Fatalf("claim %s: %v", token, err)
	}
	return out
}

// TestMarkOfLeaseExtendedShorterExpires: the mark is kept "for
// the lease (extended with it) and the backstop's TTL after it"
// (docs/design.md, the backstop; extendMark's doc: "for d from now and
// the backstop's TTL after that"). Commits 25e7e67 and 0df4d74 made
// memstore and pgstore keep a record for the TTL after a lease extended
// shorter, as extend.lua does, but backstop's extend SQL still keeps
// GREATEST(expires_at, …): a dead holder's lease extended shorter keeps
// its mark up to the original lease longer. Redis forgot the key, and a
// claim with another payload, which Redis grants as a fresh key, is
// answered Mismatch by the stale mark. The control key, claimed with the
// short lease directly, is granted.
func TestMarkOfLeaseExtendedShorterExpires(t *testing.T) {
	t.Parallel()
	const ttl = time.Second // backstop TTL = guard TTL ("at least as long")
	m := newMarkEnv(t, ttl)
	s, rs := m.s, m.rs
	claim := func(key guard.Key, fp string, lease time.Duration) guard.Outcome {
		return m.claim(key, rand.Text(), fp, lease, 0)
	}
	control, shortened := newKey(t), newKey(t)
	if out := claim(control, "A", 300*time.Millisecond); out.Status != guard.Acquired {
		t.Fatalf("control claim: %v", out.Status)
	}
	out := claim(shortened, "A", 30*time.Second)
	if out.Status != guard.Acquired {
		t.Fatalf("claim: %v", out.Status)
	}
	if err := s.Extend(ctx, out.Lease, 300*time.Millisecond); err != nil {
		t.Fatalf("Extend to a shorter lease: %v", err)
	}
	// Both holders die. Both leases (300 ms) and their TTL (1 s) are over.
	time.Sleep(300*time.Millisecond + ttl + 500*time.Millisecond)
	for _, k := range []struct {
		name string
		key  guard.Key
	}{{"control (claimed with the short lease)", control}, {"lease extended shorter", shortened}} {
		if _, err := rs.Get(ctx, k.key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("%s: Redis still has the record: %v", k.name, err)
		}
		if out := claim(k.key, "B", 10*time.Second); out.Status != guard.Acquired {
			t.Errorf("%s: a claim with another payload after the lease and TTL = %v; want acquired (Redis forgot the key, and the mark's lease and TTL are over)", k.name, out.Status)
		}
	}
}

// TestFailedMarkExpiresWithTheStoresRecord: ed2f672 made a mark kept "for
// the TTL after the new lease's end" when its holder extends it shorter,
// because a mark kept longer than the store keeps the record refused the
// key's next payload (Mismatch) after the store had forgotten the key.
// The same happens on a Fail: Redis keeps the failed record for the TTL
// from the failure (fail.lua: SET ... PX ttl; pgstore's fail writes
// expires_at = now + ttl), but backstop's unmark ends the mark's lease
// and leaves expires_at at the old lease's end + TTL. design.md: "The
// mark is kept for the lease ... and the backstop's TTL after it; a
// failure or release ends its lease". So for up to a whole lease
// (30 s by default) after Redis forgot the failed key, a request with
// another payload, which Redis grants, is refused 422 by the stale mark.
// The control key's holder claimed with a short lease (its mark ends
// when Redis's record does) and is granted.
func TestFailedMarkExpiresWithTheStoresRecord(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	m := newMarkEnv(t, ttl)
	s, rs := m.s, m.rs
	claim := func(key guard.Key, fp string, lease time.Duration) guard.Outcome {
		return m.claim(key, rand.Text(), fp, lease, 0)
	}
	control, failed := newKey(t), newKey(t)
	for _, k := range []struct {
		key   guard.Key
		lease time.Duration
	}{{control, 200 * time.Millisecond}, {failed, 30 * time.Second}} {
		out := claim(k.key, "A", k.lease)
		if out.Status != guard.Acquired {
			t.Fatalf("claim: %v", out.Status)
		}
		// The attempt fails at once (the payment provider refused it).
		if err := s.Fail(ctx, out.Lease, "declined", ttl); err != nil {
			t.Fatalf("Fail: %v", err)
		}
	}
	// The failed records' TTL (1 s from the failure) is over.
	time.Sleep(ttl + 700*time.Millisecond)
	for _, k := range []struct {
		name string
		key  guard.Key
	}{{"control (short lease)", control}, {"failed within a 30 s lease", failed}} {
		if _, err := rs.Get(ctx, k.key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("%s: Redis still has the record: %v", k.name, err)
		}
		if out := claim(k.key, "B", 10*time.Second); out.Status != guard.Acquired {
			t.Errorf("%s: a claim with another payload after the failed record's TTL = %v; want acquired (Redis forgot the key; the mark's lease ended with the failure, and the TTL after it is over)", k.name, out.Status)
		}
	}
}

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
	m := newMarkEnv(t, ttl)
	s, rs, rdb := m.s, m.rs, m.rdb
	key := newKey(t)
	claim := func(tok, fp string, lease time.Duration) guard.Outcome {
		return m.claim(key, tok, fp, lease, 5)
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
