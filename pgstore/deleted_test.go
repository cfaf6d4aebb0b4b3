package pgstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestRowDeletedUnderHolder: an operator deletes the row of a key while
// its holder runs. The holder's writes then change nothing (completion,
// failure, extension and steps: guard.ErrLeaseLost; release: nil, the key
// is gone), and the next claim takes the key as new (fence 1: the row
// that kept the fence growing is gone, as after Purge; docs/design.md,
// rule 4).
func TestRowDeletedUnderHolder(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "deleted"}
	r := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	a, err := s.Claim(ctx, r)
	if err != nil || a.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", a, err)
	}
	pgenv.Exec(t, db, `DELETE FROM idemguard_keys WHERE scope = $1 AND id = $2`, key.Scope, key.ID)
	for what, err := range map[string]error{
		"complete": s.Complete(ctx, a.Lease, []byte("a"), time.Hour),
		"fail":     s.Fail(ctx, a.Lease, "x", time.Hour),
		"extend":   s.Extend(ctx, a.Lease, time.Minute),
		"step":     s.SaveStep(ctx, a.Lease, 0, guard.StepResult{Name: "s1"}),
	} {
		if !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("%s after the row was deleted = %v, want ErrLeaseLost", what, err)
		}
	}
	if err := s.Release(ctx, a.Lease); err != nil {
		t.Errorf("release after the row was deleted = %v, want nil", err)
	}
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("Get = %v, want ErrNotFound: the holder's writes re-created the row", err)
	}
	r.Token = "B"
	if b, err := s.Claim(ctx, r); err != nil || b.Status != guard.Acquired || b.Lease.Fence != 1 || b.Lease.Attempt != 1 {
		t.Fatalf("claim after the deletion = %+v, %v; want a first attempt", b, err)
	}
}
