package fallback_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestOneStalledMarkKeepsBreakerClosed: fallback over backstop.Wrap, Redis
// and PostgreSQL up, one holder's mark row locked by a transaction of
// someone else's (an operator's SELECT … FOR UPDATE, a long business
// transaction) for the whole of the holder's lease. Every extension of
// that holder's lease then answers ErrUnavailable (its mark was not
// extended), and its keepalive tries again ever sooner as the deadline
// nears, so it ends the holder's run, as it must. Those are one key's
// failures, not the primary's: the breaker stays closed, and a claim of
// another key is served by the primary, not refused (FailClosed) for
// OpenTimeout.
func TestOneStalledMarkKeepsBreakerClosed(t *testing.T) {
	ctx := context.Background()
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var opened atomic.Int32
	s := newStore(t, backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b), fallback.Options{
		Policy: fallback.FailClosed, FailuresToOpen: 3, OpenTimeout: time.Hour, Timeout: 400 * time.Millisecond, Logger: quiet,
		OnStateChange: func(_, to fallback.State) {
			if to == fallback.StateOpen {
				opened.Add(1)
			}
		},
	})
	g := guard.New(s, guard.Options{Lease: 2 * time.Second})
	key := guard.Key{Scope: "stall", ID: t.Name()}
	in, locked := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := g.Do(ctx, key, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
			close(in)
			<-locked
			<-ctx.Done() // the keepalive ends the run: the mark was never extended
			return nil, context.Cause(ctx)
		})
		done <- err
	}()
	<-in
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM idemguard_keys WHERE scope = $1 AND id = $2 FOR UPDATE`, key.Scope, key.ID); err != nil {
		t.Fatal(err)
	}
	close(locked)
	if err := <-done; !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("the holder whose mark was never extended = %v; want its run ended (ErrLeaseLost)", err)
	}
	_ = tx.Rollback()
	if n := opened.Load(); n != 0 {
		t.Errorf("the breaker opened %d times for one holder's stalled mark", n)
	}
	out, err := g.Claim(ctx, guard.Key{Scope: "stall", ID: t.Name() + "-other"}, "fp")
	if err != nil || out.Status != guard.Acquired {
		t.Errorf("claim of another key after one holder's mark stalled = %+v, %v; want acquired", out, err)
	}
	// The ended holder's attempt failed through Wrap, and its mark, whose
	// lease was never extended, keeps nobody out: the next claim takes the
	// key over with a larger fence.
	out, err = g.Claim(ctx, key, "fp")
	if err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 2 || out.Lease.Fence < 2 {
		t.Errorf("claim of the stalled holder's key after it ended = %+v, %v; want acquired, attempt 2, fence 2 or more", out, err)
	}
}
