package backstop_test

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

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
		if _, err := rs.Get(ctx, k.key); err != guard.ErrNotFound {
			t.Fatalf("%s: Redis still has the record: %v", k.name, err)
		}
		if out := claim(k.key, "B", 10*time.Second); out.Status != guard.Acquired {
			t.Errorf("%s: a claim with another payload after the lease and TTL = %v; want acquired (Redis forgot the key, and the mark's lease and TTL are over)", k.name, out.Status)
		}
	}
}
