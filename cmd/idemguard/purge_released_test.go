package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestPurgeKeepsReleasedFirstAttemptsFence:
// a released first attempt (a handler that answered 503, an effect that
// panicked, guard.ErrRejected) ran, and a write of its may still be on
// its way downstream; design.md rule 4 therefore has the next claim take
// a larger fence (Redis keeps its released marker a minute; "pgstore
// keeps such a row ... so its fences go on growing"). pgstore marks that
// row expired a second before the release, so `idemguard purge`
// (default --before 0) run between the release and the client's retry
// deleted it, and the retry's claim got the released holder's fence
// again: a downstream check on Lease.Fence took both holders' writes.
// Expected: a purge right after the release leaves the fence growing;
// the row goes once it has kept the fence for a minute.
func TestPurgeKeepsReleasedFirstAttemptsFence(t *testing.T) {
	db, dsn := testenv.Postgres(t)
	ctx := context.Background()
	if code, _, stderr := cli(t, "migrate", "--postgres", dsn, "up"); code != 0 {
		t.Fatal(stderr)
	}
	store, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := guard.New(store, guard.Options{Lease: time.Minute})
	key := guard.Key{Scope: "POST /charges", ID: "503-then-retry"}
	var releasedFence int64
	// The first attempt runs and is released (httpx does so on a 5xx).
	_, err = g.Do(ctx, key, "fp", func(_ context.Context, l guard.Lease) ([]byte, error) {
		releasedFence = l.Fence
		return nil, guard.ErrRejected
	})
	if !errors.Is(err, guard.ErrRejected) || releasedFence == 0 {
		t.Fatalf("first attempt: %v (fence %d)", err, releasedFence)
	}

	if code, out, stderr := cli(t, "purge", "--postgres", dsn); code != 0 {
		t.Fatalf("purge: exit %d: %s %s", code, out, stderr)
	}

	retry, err := g.Claim(ctx, key, "fp")
	if err != nil || retry.Status != guard.Acquired {
		t.Fatalf("the retry's claim: %+v, %v", retry, err)
	}
	if retry.Lease.Fence <= releasedFence {
		t.Errorf("the retry's claim after a purge has fence %d, the released holder had %d: "+
			"a fenced downstream write cannot tell them apart (purge deleted the released first attempt's row at once)",
			retry.Lease.Fence, releasedFence)
	}

	// Once released more than a minute ago, the row is purged as any
	// expired one (moved back in time by hand: no test waits a minute).
	if _, err := g.Do(ctx, guard.Key{Scope: key.Scope, ID: "old-release"}, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		return nil, guard.ErrRejected
	}); !errors.Is(err, guard.ErrRejected) {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `UPDATE idemguard_keys SET expires_at = expires_at - interval '61 seconds' WHERE id = 'old-release'`); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := cli(t, "purge", "--postgres", dsn); code != 0 || out == "" {
		t.Fatalf("purge: exit %d: %s %s", code, out, stderr)
	}
	var left int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys WHERE id = 'old-release'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("a row released over a minute ago was not purged")
	}
}
