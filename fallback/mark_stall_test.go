package fallback_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
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
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The fallback's Timeout is short beside the lease, so that the
	// holder's extensions fail many times before its deadline (each one
	// waits half of it for the locked row). A loaded machine can hold a
	// claim or the holder's Fail back past that Timeout: such a round
	// proves nothing and runs again with the lease and Timeout twice as
	// long (the Timeout stays below backstop's unmark bound of 2s, so the
	// holder's Fail still ends at the Timeout, not the unmark's bound).
	const first = 400 * time.Millisecond
	testenv.OnTime(t, "a Timeout", first, 3, func(timeout time.Duration) bool {
		return stalledMarkRound(t, db, b, timeout/first)
	})
}

// stalledMarkRound runs TestOneStalledMarkKeepsBreakerClosed's case with
// a lease of scale × 2s and a Timeout of scale × 400ms; late reports that
// a call the case needs answered within that Timeout was not, and the
// round proved nothing.
func stalledMarkRound(t *testing.T, db *sql.DB, b *backstop.Backstop, scale time.Duration) (late bool) {
	ctx := context.Background()
	timeout := scale * 400 * time.Millisecond
	var opened atomic.Int32
	redisStore := guardenv.Store(t, guard.RedisOptions{})
	s := newStore(t, backstop.Wrap(redisStore, b), fallback.Options{
		Policy: fallback.FailClosed, FailuresToOpen: 3, OpenTimeout: time.Hour, Timeout: timeout, Logger: quiet,
		OnStateChange: func(_, to fallback.State) {
			if to == fallback.StateOpen {
				opened.Add(1)
			}
		},
	})
	g := guard.New(s, guard.Options{Lease: scale * 2 * time.Second})
	key := guard.Key{Scope: "stall", ID: fmt.Sprintf("%s-%d", t.Name(), scale)}
	in, locked := make(chan guard.Lease, 1), make(chan struct{})
	unlock := sync.OnceFunc(func() { close(locked) })
	defer unlock() // a round that ends early lets the holder run out its lease
	done := make(chan error, 1)
	// slow reports whether a call sent at sent that failed with err was
	// given up at its Timeout: the answer a late call gets, not the open
	// breaker's.
	slow := func(what string, sent time.Time, err error) bool {
		took := time.Since(sent)
		if errors.Is(err, guard.ErrUnavailable) && !errors.Is(err, fallback.ErrBreakerOpen) && took >= timeout {
			t.Logf("%s took %s: %v", what, took, err)
			return true
		}
		return false
	}
	sent := time.Now()
	go func() {
		_, err := g.Do(ctx, key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			in <- l
			<-locked
			<-ctx.Done() // the keepalive ends the run: the mark was never extended
			return nil, context.Cause(ctx)
		})
		done <- err
	}()
	var held guard.Lease
	select {
	case held = <-in:
	case err := <-done:
		if slow("the holder's claim", sent, err) {
			return true
		}
		t.Fatalf("the holder's claim = %v; want acquired", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM idemguard_keys WHERE scope = $1 AND id = $2 FOR UPDATE`, key.Scope, key.ID); err != nil {
		t.Fatal(err)
	}
	unlock()
	if err := <-done; !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("the holder whose mark was never extended = %v; want its run ended (ErrLeaseLost)", err)
	}
	_ = tx.Rollback()
	if n := opened.Load(); n != 0 {
		t.Errorf("the breaker opened %d times for one holder's stalled mark", n)
		return false
	}
	// The holder's Fail reaches Redis before its mark, which the locked
	// row holds up past the Timeout: a Fail that Redis has not taken was
	// given up at the Timeout before Redis answered, and Redis rightly
	// keeps the holder's (extended) lease.
	if rec, err := redisStore.Get(ctx, key); err == nil && rec.State == guard.StatePending && rec.Token == held.Token {
		t.Logf("the holder's Fail was given up before Redis took it")
		return true
	}
	sent = time.Now()
	out, err := g.Claim(ctx, guard.Key{Scope: "stall", ID: key.ID + "-other"}, "fp")
	if slow("the claim of another key", sent, err) {
		return true
	}
	if err != nil || out.Status != guard.Acquired {
		t.Errorf("claim of another key after one holder's mark stalled = %+v, %v; want acquired", out, err)
	}
	// The ended holder's attempt failed through Wrap, and its mark, whose
	// lease was never extended, keeps nobody out: the next claim takes the
	// key over with a larger fence. (An extension given up while it waited
	// for the row, applied once the lock is gone and after the Fail ended
	// the mark's lease, does not revive it: backstop's
	// TestWrapExtensionAfterFailKeepsMarkEnded. It did, one run in ~40 under
	// load: in_progress, LeaseLeft 1.6s.)
	sent = time.Now()
	out, err = g.Claim(ctx, key, "fp")
	if slow("the claim of the stalled holder's key", sent, err) {
		return true
	}
	if err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 2 || out.Lease.Fence < 2 {
		t.Errorf("claim of the stalled holder's key after it ended = %+v, %v; want acquired, attempt 2, fence 2 or more", out, err)
	}
	return false
}
