package backstop_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestExhaustedNotReplayedAnotherPayload: under Wrap, a claim Redis
// answers Exhausted is replayed the backstop's committed row only when
// that row was committed for the claim's own payload; a row another
// payload committed answers Mismatch. (Any committed row was replayed: a
// request of payload B was handed the result committed for payload A.)
//
// How the two disagree: the backstop's TTL shorter than the guard's
// (pgstore.Options.TTL asks them equal; with them equal, a failed mark is
// kept as long as the store's failed record, and A's commit below is
// refused). B's last holder, paused past its lease, fails late, so Redis
// keeps its failed record for the guard's TTL from then, while its mark
// expired the backstop's shorter TTL after its lease, before the Fail
// reached it. Meanwhile an unguarded
// (fail-open, fence 0) effect of payload A commits on the expired mark,
// as Commit allows. The real durations are the pause, not
// synchronisation; a round a loaded machine made too slow runs again
// with a longer TTL.
func TestExhaustedNotReplayedAnotherPayload(t *testing.T) {
	t.Parallel()
	testenv.OnTime(t, "a TTL", 2*time.Second, 3, func(ttl time.Duration) (late bool) {
		const lease = 100 * time.Millisecond
		pause := ttl * 3 / 4
		db := pgenv.Migrated(t, pgstore.Options{})
		b := mustBackstop(t, db, pgstore.Options{TTL: ttl / 2})
		s := backstop.Wrap(guardenv.StoreOn(t, testenv.Redis(t), guard.RedisOptions{}), b)
		key := newKey(t)
		req := func(tok, fp string) guard.ClaimRequest {
			return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: lease, TTL: ttl, MaxAttempts: 1}
		}
		start := time.Now()
		out, err := s.Claim(ctx, req("B1", "fp-b"))
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim B1 = %s, %v", out.Status, err)
		}
		// The holder, paused past its lease, fails late: Redis keeps the
		// failed record until start+pause+ttl; the mark expired at
		// start+lease+ttl/2, before the Fail.
		time.Sleep(time.Until(start.Add(pause)))
		if err := s.Fail(ctx, out.Lease, "boom", ttl); err != nil {
			t.Fatalf("fail B1: %v", err)
		}
		time.Sleep(time.Until(start.Add(pause + ttl/2 + 300*time.Millisecond)))
		// A fail-open effect of payload A (fence 0) commits its row.
		fo := guard.Lease{Key: key, Token: "failopen", Fence: 0, Attempt: 1}
		res, err := b.Func("fp-a", func(context.Context, *sql.Tx, guard.Lease) ([]byte, error) {
			return []byte("result of A"), nil
		})(ctx, fo)
		if err != nil || string(res) != "result of A" {
			t.Fatalf("fail-open Func = %q, %v", res, err)
		}
		if time.Since(start) > pause+ttl-200*time.Millisecond {
			return true // Redis's failed record may be gone: this round proves nothing
		}
		out, err = s.Claim(ctx, req("B2", "fp-b"))
		if err != nil {
			t.Fatal(err)
		}
		if out.Status != guard.Mismatch {
			t.Fatalf("claim of payload B = %s %q; want Mismatch: the key's committed row is payload A's", out.Status, out.Result)
		}
		return false
	})
}
