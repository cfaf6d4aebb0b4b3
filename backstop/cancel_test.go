package backstop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestCommitContextEndsMidStatement: a Commit whose context ends while
// its statement waits (here, for the row of the same key that another
// transaction inserted and has not committed yet) reports the context's
// end, as a call that never began does: a deadline as guard.ErrUnavailable
// and context.DeadlineExceeded, a cancellation as context.Canceled. lib/pq
// cancels the statement and returns the server's answer, SQLSTATE 57014
// (query_canceled), which was reported as a plain error, neither.
func TestCommitContextEndsMidStatement(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	key := newKey(t)
	first, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Rollback() }()
	if err := b.Commit(ctx, first, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}, "fp", []byte("r")); err != nil {
		t.Fatalf("first Commit: %v", err)
	}

	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{"deadline", func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 200*time.Millisecond) }, guard.ErrUnavailable},
		{"cancel", func() (context.Context, context.CancelFunc) {
			c, cancel := context.WithCancel(ctx)
			stop := time.AfterFunc(200*time.Millisecond, cancel)
			return c, func() { stop.Stop(); cancel() }
		}, context.Canceled},
	} {
		t.Run(c.name, func(t *testing.T) {
			cctx, cancel := c.ctx()
			defer cancel()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback() }()
			err = b.Commit(cctx, tx, guard.Lease{Key: key, Token: "B", Fence: 2, Attempt: 2}, "fp", []byte("r"))
			if !errors.Is(err, c.want) {
				t.Fatalf("Commit whose context ended while it waited = %v; want %v", err, c.want)
			}
			if c.want == guard.ErrUnavailable && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Commit = %v; want context.DeadlineExceeded too", err)
			}
		})
	}
}
