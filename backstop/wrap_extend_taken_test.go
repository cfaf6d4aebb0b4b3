package backstop_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapExtendMarkTakenOver: holder A's mark lease ran out (its
// extension did not reach PostgreSQL) while Redis still holds A's lease,
// and a pgstore.Store on the same tables (a fallback's secondary) took the
// key over from the lapsed mark: B now holds it there. A's next Extend,
// which Redis takes, must not answer success because the mark bears
// another token (as a mark that is gone or committed does): it answers
// ErrLeaseLost, so A stops rather than run beside B. Its writes through
// Wrap leave B's mark alone.
func TestWrapExtendMarkTakenOver(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	s := backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)
	pg := pgenv.Store(t, db, pgstore.Options{})
	for _, batch := range []bool{false, true} {
		key := newKey(t)
		out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Minute})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim A = %s, %v", out.Status, err)
		}
		// A's mark's lease ran out: its extension never reached PostgreSQL.
		pgenv.Exec(t, db, `UPDATE idemguard_keys SET leased_until = clock_timestamp() - interval '1 ms' WHERE id = $1`, key.ID)
		bOut, err := pg.Claim(ctx, guard.ClaimRequest{Key: key, Token: "B", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Minute})
		if err != nil || bOut.Status != guard.Acquired {
			t.Fatalf("claim B in PostgreSQL = %s, %v", bOut.Status, err)
		}
		var eerr error
		if batch {
			eerr = s.(guard.BatchStore).WriteBatch(ctx, []guard.Write{{Kind: guard.WriteExtend, Lease: out.Lease, TTL: 10 * time.Second}})[0]
		} else {
			eerr = s.Extend(ctx, out.Lease, 10*time.Second)
		}
		if !errors.Is(eerr, guard.ErrLeaseLost) {
			t.Errorf("batch %t: A's Extend after B took its mark over = %v; want ErrLeaseLost", batch, eerr)
		}
		if err := s.Fail(ctx, out.Lease, "stopped", time.Minute); err != nil {
			t.Errorf("batch %t: A's Fail = %v", batch, err)
		}
		if err := pg.Extend(ctx, bOut.Lease, 10*time.Second); err != nil {
			t.Errorf("batch %t: B's lease after A stopped = %v; want it held", batch, err)
		}
	}
}
