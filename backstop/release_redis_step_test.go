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

// TestReleaseWithRedisStepKeepsMark: a first attempt released after a
// step recorded in Redis only (guard.Step around a call to another
// service, no backstop step row) is kept by Redis (failed, with its
// steps: release.lua), and so is its mark: once Redis forgets the key,
// another payload is refused (Mismatch). (Wrap undid the mark as if the
// key had never been claimed, and the other payload took the key.)
func TestReleaseWithRedisStepKeepsMark(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	rdb := testenv.Redis(t)
	rs := guardenv.StoreOn(t, rdb, guard.RedisOptions{})
	s := backstop.Wrap(rs, b)
	key := newKey(t)
	req := func(tok, fp string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: 10 * time.Second, TTL: time.Hour, MaxAttempts: 3}
	}
	out, err := s.Claim(ctx, req("A", "fp-a"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim A = %s, %v", out.Status, err)
	}
	a := out.Lease
	if err := s.(guard.StepStore).SaveStep(ctx, a, 0, guard.StepResult{Name: "charge", Result: []byte("charged fp-a")}); err != nil {
		t.Fatalf("SaveStep: %v", err)
	}
	if err := s.Release(ctx, a); err != nil {
		t.Fatalf("release A: %v", err)
	}
	rec, err := rs.Get(ctx, key)
	if err != nil || rec.State != guard.StateFailed || len(rec.Steps) != 1 {
		t.Fatalf("Redis record after the release = %+v, %v; want failed with its step", rec, err)
	}
	if out, err := s.Claim(ctx, req("B", "fp-b")); err != nil || out.Status != guard.Mismatch {
		t.Fatalf("claim with another payload while Redis remembers = %s, %v; want Mismatch", out.Status, err)
	}
	// Redis forgets the key (failover, FLUSHALL, eviction).
	if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
		t.Fatal(err)
	}
	out, err = s.Claim(ctx, req("C", "fp-c"))
	if err != nil || out.Status != guard.Mismatch {
		t.Fatalf("claim with another payload once Redis forgot = %s (fence %d), %v; want Mismatch: the mark must stay as Redis kept the record (a step happened)", out.Status, out.Lease.Fence, err)
	}
}
