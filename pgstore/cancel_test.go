package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestContextEndsMidStatement: a call whose context ends while its
// statement runs (here, waiting for a row lock a business transaction
// holds) reports the context's end as a call that never began does: a
// deadline as guard.ErrUnavailable and context.DeadlineExceeded, a
// cancellation as context.Canceled, as the Redis store does. lib/pq
// cancels the statement and returns the server's answer, SQLSTATE 57014
// (query_canceled), which the Store reported as a plain error, neither.
func TestContextEndsMidStatement(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "locked"}
	r := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	a, err := s.Claim(ctx, r)
	if err != nil || a.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", a, err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM idemguard_keys WHERE scope = $1 AND id = $2 FOR UPDATE`, key.Scope, key.ID); err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = s.Complete(short, a.Lease, []byte("x"), time.Hour)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, guard.ErrUnavailable) {
		t.Errorf("complete whose deadline passed while it waited = %v; want context.DeadlineExceeded and ErrUnavailable", err)
	}
	cancelled, cancelNow := context.WithCancel(ctx)
	stop := time.AfterFunc(200*time.Millisecond, cancelNow)
	defer stop.Stop()
	err = s.Extend(cancelled, a.Lease, time.Minute)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("extend cancelled while it waited = %v; want context.Canceled", err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, key); err != nil || rec.State != guard.StatePending || rec.Token != "A" {
		t.Fatalf("record after the cancelled calls = %+v, %v; want A's pending record", rec, err)
	}
}
