package backstop_test

import (
	"crypto/rand"
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
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{TTL: ttl})
	rs := guardenv.StoreOn(t, testenv.Redis(t), guard.RedisOptions{})
	s := backstop.Wrap(rs, b)
	claim := func(key guard.Key, fp string, lease time.Duration) guard.Outcome {
		t.Helper()
		out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: rand.Text(), Fingerprint: fp, Lease: lease, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return out
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
