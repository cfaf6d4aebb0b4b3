package backstop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapFenceAfterOlderSnapshot: the case of
// guard's TestFenceAfterOlderSnapshot under Wrap. Redis, restarted
// from a snapshot older than a takeover, hands the takeover's fence out
// again; the backstop's mark of the holder whose takeover Redis forgot
// (its lease alive) answers the next claim in progress, and once that
// holder fails, the next claim's fence is above its fence.
func TestWrapFenceAfterOlderSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	c := srv.Client()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := backstop.Wrap(guard.NewRedisStore(c, guard.RedisOptions{Unpipelined: true}), mustBackstop(t, db, pgstore.Options{}))
	key := guard.Key{Scope: "POST /charges", ID: "snapshot"}
	req := func(tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	a, err := s.Claim(ctx, req("A"))
	if err != nil || a.Status != guard.Acquired {
		t.Fatal(a, err)
	}
	if err := s.Fail(ctx, a.Lease, "declined", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.Save(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	b, err := s.Claim(ctx, req("B"))
	if err != nil || b.Status != guard.Acquired {
		t.Fatal(b, err)
	}
	srv.Kill()
	srv.Restart()
	var out guard.Outcome
	testenv.WaitFor(t, 10*time.Second, "a claim after the restart", func() bool {
		out, err = s.Claim(ctx, req("C"))
		return err == nil || !errors.Is(err, guard.ErrUnavailable)
	})
	if err != nil || out.Status != guard.InProgress {
		t.Fatalf("claim while the forgotten holder's mark is alive = %+v, %v; want in progress", out, err)
	}
	if err := s.Fail(ctx, b.Lease, "declined", time.Hour); err != nil && !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatal(err)
	}
	out, err = s.Claim(ctx, req("D"))
	if err != nil || out.Status != guard.Acquired || out.Lease.Fence <= b.Lease.Fence {
		t.Fatalf("claim after the forgotten holder failed = %+v, %v; want acquired with a fence above %d", out, err, b.Lease.Fence)
	}
}
