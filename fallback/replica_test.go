package fallback_test

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// replica is one process of a service run as several (gateway replicas):
// a client of its own on the shared Redis, a Postgres Store of its own on
// the shared tables, and a fallback.Store with a breaker of its own.
type replica struct {
	s *fallback.Store
	g *guard.Guard
}

func newReplica(t *testing.T, srv *testenv.Server, prefix string, pg *pgstore.Store, opts fallback.Options) replica {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	opts.Policy, opts.Secondary, opts.Logger = fallback.Secondary, pg, quiet
	s := newStore(t, guard.NewRedisStore(c, guard.RedisOptions{Prefix: prefix}), opts)
	return replica{s: s, g: guard.New(s, guard.Options{Lease: 5 * time.Second, TTL: time.Hour})}
}

// A key one replica completed in the secondary during an outage its
// breaker saw is not run again through Redis by another replica whose
// breaker never opened (it had no claim to make while Redis was away):
// every acquisition Redis grants is checked against the secondary, not
// only in the process that wrote there.
func TestReplicaSwitchBack(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t)
	pgA, db := pgStore(t)
	pgB, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	prefix := testenv.Prefix(t)
	opts := fallback.Options{Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, OpenTimeout: time.Minute}
	aOpts := opts
	aOpts.FailuresToOpen = 1
	a := newReplica(t, srv, prefix, pgA, aOpts)
	b := newReplica(t, srv, prefix, pgB, opts)

	ran := newEffects()
	do := func(r replica, id string) (guard.Result, error) {
		return r.g.Do(bg, guard.Key{Scope: "replica", ID: id}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			ran.add(id)
			return []byte("paid " + id), nil
		})
	}
	// Both replicas have served a key through Redis: their pools are warm.
	for i, r := range []replica{a, b} {
		if _, err := do(r, "warm-"+string(rune('a'+i))); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
	}

	srv.Kill()
	openBreaker(t, a.s)
	if res, err := do(a, "k"); err != nil || res.Replayed || ran.get("k") != 1 {
		t.Fatalf("replica A during the outage: %+v, %v (ran %d)", res, err, ran.get("k"))
	}
	srv.Restart()

	// Replica B's breaker is closed: it had nothing to claim during the
	// outage. The retry of k reaches it.
	if st := b.s.State(); st != fallback.StateClosed {
		t.Fatalf("replica B's breaker: %v, want closed", st)
	}
	var res guard.Result
	testenv.WaitFor(t, 10*time.Second, "replica B answers k", func() bool {
		res, err = do(b, "k")
		return err == nil // a first call on a pool of dead connections may fail
	})
	if n := ran.get("k"); n != 1 || !res.Replayed || string(res.Value) != "paid k" {
		t.Fatalf("retry of k through replica B: %+v (ran %d times, want 1 and a replay)", res, n)
	}
}

// The check of every acquisition against the secondary (for another
// replica's outage) does not make the secondary a dependency of a primary
// that answers: a Store that wrote nothing there lets the primary's lease
// stand when the secondary cannot be read, and does not ask it again for
// OpenTimeout, so its trouble costs one check, not one per claim.
func TestReplicaSecondaryDownPrimaryServes(t *testing.T) {
	t.Parallel()
	p := newPrimary(t)
	pg, db := pgStore(t)
	sec := &counting{Store: pg}
	s := newStore(t, p.store, fallback.Options{Policy: fallback.Secondary, Secondary: sec, OpenTimeout: time.Minute,
		Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet})
	g := guard.New(s, guard.Options{Lease: 5 * time.Second, TTL: time.Hour})
	_ = db.Close() // PostgreSQL is gone; Redis serves
	ran := newEffects()
	for _, id := range []string{"a", "b", "c"} {
		res, err := g.Do(bg, guard.Key{Scope: "replica", ID: id}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
			ran.add(id)
			return []byte("paid " + id), nil
		})
		if err != nil || res.Replayed || ran.get(id) != 1 {
			t.Fatalf("Do %s with the secondary down: %+v, %v (ran %d)", id, res, err, ran.get(id))
		}
	}
	if n := sec.gets.Load(); n != 1 {
		t.Fatalf("%d reads of the unreadable secondary for three claims, want 1", n)
	}
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("breaker %v: the secondary's trouble is not the primary's", st)
	}
}

// TestReplicaSplitOverBackstop: two replicas whose breakers disagree, as
// in the moment Redis returns (here replica A is cut off from Redis while
// B reaches it), each over backstop.Wrap on the tables its secondary
// uses. A key one of them holds, in the secondary (A) or in Redis with
// Wrap's mark (B), is in progress for the other, and once committed
// replays there: each key is paid once. Without Wrap the two stores share
// nothing at that moment, and both would run it (doc.go).
func TestReplicaSplitOverBackstop(t *testing.T) {
	t.Parallel()
	pg, db := pgStore(t)
	pgenv.PaymentsTable(t, db)
	prefix := testenv.Prefix(t)
	over := func(addr string, pg guard.Store) (*fallback.Store, *guard.Guard, *backstop.Backstop) {
		c := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1})
		t.Cleanup(func() { _ = c.Close() })
		b, err := backstop.New(db, pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		s := newStore(t, backstop.Wrap(guard.NewRedisStore(c, guard.RedisOptions{Prefix: prefix}), b), fallback.Options{
			Policy: fallback.Secondary, Secondary: pg, FailuresToOpen: 1, OpenTimeout: time.Hour,
			Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet})
		return s, guard.New(s, guard.Options{Lease: 30 * time.Second, TTL: time.Hour}), b
	}
	pgB, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sA, gA, bA := over("127.0.0.1:"+strconv.Itoa(testenv.FreePort(t)), pg) // nothing listens: A's Redis is out
	_, gB, bB := over(testenv.RedisAddr(t), pgB)
	openBreaker(t, sA)

	paid := func(b *backstop.Backstop, hold chan struct{}) guard.Func {
		return b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.ID, l.Fence); err != nil {
				return nil, err
			}
			if hold != nil {
				<-hold
			}
			return []byte("paid " + l.Key.ID), nil
		})
	}
	for _, c := range []struct {
		id                string
		holder, other     *guard.Guard
		holderB, otherB   *backstop.Backstop
		holderIn, otherIn string
	}{
		{"held-in-secondary", gA, gB, bA, bB, "A (secondary)", "B (Redis)"},
		{"held-in-redis", gB, gA, bB, bA, "B (Redis)", "A (secondary)"},
	} {
		k := guard.Key{Scope: "split", ID: c.id}
		hold, done := make(chan struct{}), make(chan error, 1)
		started := make(chan struct{})
		go func() {
			_, err := c.holder.Do(bg, k, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
				close(started)
				return paid(c.holderB, hold)(ctx, l)
			})
			done <- err
		}()
		<-started
		if _, err := c.other.Do(bg, k, "fp", paid(c.otherB, nil)); !errors.Is(err, guard.ErrInProgress) {
			t.Errorf("%s: %s claims it while %s holds it: %v, want ErrInProgress", c.id, c.otherIn, c.holderIn, err)
		}
		close(hold)
		if err := <-done; err != nil {
			t.Fatalf("%s: holder %s: %v", c.id, c.holderIn, err)
		}
		res, err := c.other.Do(bg, k, "fp", paid(c.otherB, nil))
		if err != nil || !res.Replayed || string(res.Value) != "paid "+c.id {
			t.Errorf("%s: %s after %s completed: %+v, %v; want its replay", c.id, c.otherIn, c.holderIn, res, err)
		}
	}
	if rows, keys := pgenv.CountPayments(t, db); rows != 2 || keys != 2 {
		t.Fatalf("payments: %d rows for %d keys, want one each for 2", rows, keys)
	}
}
