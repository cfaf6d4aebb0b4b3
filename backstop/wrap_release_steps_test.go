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

// TestWrapReleaseAfterStepKeepsMark: a first attempt released after one
// of its steps (a consumer shutting down between two steps, a 5xx
// released by httpx) is not as if never claimed: the step's effect
// happened. Redis keeps its record (failed, with the steps), and the
// holder's mark stays too, whether the step committed a row in PostgreSQL
// (CommitStep) or was recorded in Redis only (guard.Step around a call to
// another service). Otherwise, once Redis forgot the key, a request with
// another payload took it (and, running the same step, was handed the
// first payload's committed result as its own). The mark was undone for a
// step recorded in Redis only.
func TestWrapReleaseAfterStepKeepsMark(t *testing.T) {
	t.Parallel()
	for _, committed := range []bool{true, false} {
		name := "recorded in Redis only"
		if committed {
			name = "committed in PostgreSQL"
		}
		t.Run(name, func(t *testing.T) {
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
			if committed {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.CommitStep(ctx, tx, a, "charge", []byte("charged fp-a")); err != nil {
					t.Fatalf("CommitStep: %v", err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.(guard.StepStore).SaveStep(ctx, a, 0, guard.StepResult{Name: "charge", Result: []byte("charged fp-a")}); err != nil {
				t.Fatalf("SaveStep: %v", err)
			}
			if err := s.Release(ctx, a); err != nil {
				t.Fatalf("release A: %v", err)
			}
			if rec, err := rs.Get(ctx, key); err != nil || rec.State != guard.StateFailed || len(rec.Steps) != 1 {
				t.Fatalf("Redis record after the release = %+v, %v; want failed with its step", rec, err)
			}
			// Redis, while it remembers, refuses another payload.
			if out, err := s.Claim(ctx, req("B", "fp-b")); err != nil || out.Status != guard.Mismatch {
				t.Fatalf("claim with another payload after the release = %s, %v; want Mismatch", out.Status, err)
			}
			// Redis forgets the key (a failover that lost it, FLUSHALL).
			if err := rdb.Del(ctx, rs.Name(key)).Err(); err != nil {
				t.Fatal(err)
			}
			out, err = s.Claim(ctx, req("C", "fp-c"))
			if err != nil || out.Status != guard.Mismatch {
				t.Fatalf("claim with another payload once Redis forgot = %s (fence %d), %v; want Mismatch: fp-a's step happened", out.Status, out.Lease.Fence, err)
			}
		})
	}
}
