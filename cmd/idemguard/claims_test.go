package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// README, "Looking at a key": under backstop.Wrap, `idemguard release`
// frees Redis alone. The holder's mark in PostgreSQL keeps its lease, so
// a claim through the wrapped store answers in progress until that lease
// ends (inspect --postgres shows it), and only then is the key taken over,
// with a larger fence. Without that, an operator's --force on a live
// holder would let a second run of the payment start beside the first.
func TestClaimReleaseUnderBackstopKeepsTheMarksLease(t *testing.T) {
	addr, prefix := testenv.RedisAddr(t), testenv.Prefix(t)
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	if err := pgstore.Migrate(ctx, db, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	bs, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The holder's lease must outlast the release and the claim after it
	// on a loaded machine; the test then waits it out.
	const lease = 3 * time.Second
	redisStore := guardenv.Store(t, guard.RedisOptions{Prefix: prefix})
	g := guard.New(backstop.Wrap(redisStore, bs), guard.Options{Lease: lease})
	key := guard.Key{Scope: `"acct_42" POST /charges`, ID: "ch-1"}

	holder, err := g.Claim(ctx, key, "fp")
	if err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := cli(t, "release", "--redis", addr, "--prefix", prefix, "--force", key.Scope, key.ID); code != 0 {
		t.Fatalf("release --force: exit %d: %s %s", code, out, stderr)
	}
	// Redis is free (the record is failed by the operator) ...
	if rec, err := redisStore.Get(ctx, key); err != nil || rec.State != guard.StateFailed {
		t.Fatalf("Redis after the release: %+v, %v; want the holder's attempt failed", rec, err)
	}
	// ... but the backstop's mark still holds the key for the holder.
	if out, err := g.Claim(ctx, key, "fp"); !errors.Is(err, guard.ErrInProgress) {
		t.Fatalf("a claim while the released holder's mark is leased = %+v, %v; want ErrInProgress", out, err)
	}
	code, out, stderr := cli(t, "inspect", "--redis", addr, "--prefix", prefix, "--postgres", dsn, key.Scope, key.ID)
	if code != 0 {
		t.Fatalf("inspect --postgres: exit %d: %s", code, stderr)
	}
	_, pg, ok := strings.Cut(out, "postgres\n")
	if !ok || !strings.Contains(pg, "state        pending") || strings.Contains(pg, "lease left   none") ||
		strings.Contains(pg, "lease left   expired") {
		t.Errorf("inspect --postgres does not show the mark's live lease:\n%s", out)
	}

	// Once the mark's lease has run out, the key is taken over with a
	// fence larger than the released holder's.
	var next guard.Outcome
	testenv.WaitFor(t, 4*lease, "the released holder's mark to run out", func() bool {
		out, err := g.Claim(ctx, key, "fp")
		if errors.Is(err, guard.ErrInProgress) {
			return false
		}
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		next = out
		return true
	})
	if next.Status != guard.Acquired || next.Lease.Fence <= holder.Lease.Fence {
		t.Fatalf("claim after the mark ran out = %+v; want Acquired with a fence above %d", next, holder.Lease.Fence)
	}
}
