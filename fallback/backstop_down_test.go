package fallback_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// TestBackstopDownOverWrap: fallback over backstop.Wrap, Redis up and
// PostgreSQL refusing the backstop's writes (a trigger of this test's
// schema stands in for a database that cannot be reached). The backstop
// is part of the primary: Wrap fails closed on its claims, and their
// ErrUnavailable counts against the breaker like a Redis outage's.
//
// FailClosed: claims of new keys are refused, and once the breaker is
// open so is a key Redis holds completed (observable: ErrBreakerOpen, the
// breaker's state), until OpenTimeout has passed.
//
// FailOpen: the effect runs unguarded though Redis is up, once the
// breaker is open even for a key Redis holds completed or held by a
// running holder. Backstop.Commit still keeps each key's payment single:
// while PostgreSQL is down nothing commits, and once it is back the
// completed key's duplicate replays and the held key's is refused as a
// stale fence, the holder committing its own payment.
func TestBackstopDownOverWrap(t *testing.T) {
	t.Parallel()
	for _, policy := range []fallback.Policy{fallback.FailClosed, fallback.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			backstopDownOverWrap(t, policy)
		})
	}
}

func backstopDownOverWrap(t *testing.T, policy fallback.Policy) {
	db := pgenv.Migrated(t, pgstore.Options{})
	b := paymentsBackstop(t, db)
	var opened int
	s := newStore(t, backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b), fallback.Options{
		Policy: policy, FailuresToOpen: 2, OpenTimeout: time.Hour, Logger: quiet,
		OnStateChange: func(_, to fallback.State) {
			if to == fallback.StateOpen {
				opened++
			}
		},
	})
	g := guard.New(s, guard.Options{Lease: time.Minute})
	runs := 0
	pay := b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		runs++
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.ID, l.Fence)
		return []byte("paid " + l.Key.ID), err
	})
	k := func(id string) guard.Key { return guard.Key{Scope: "down", ID: id} }

	// Before the outage: "done" is paid (completed in Redis), "held" has a
	// holder still running.
	if res, err := g.Do(bg, k("done"), "fp", pay); err != nil || string(res.Value) != "paid done" {
		t.Fatalf("done: %q, %v", res.Value, err)
	}
	held, err := g.Claim(bg, k("held"), "fp")
	if err != nil || held.Status != guard.Acquired {
		t.Fatalf("held: %s, %v", held.Status, err)
	}
	runs = 0

	pgenv.Exec(t, db, `CREATE FUNCTION down() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'simulated outage' USING ERRCODE = '57P03'; END $$`)
	pgenv.Exec(t, db, `CREATE TRIGGER down BEFORE INSERT OR UPDATE ON idemguard_keys FOR EACH ROW EXECUTE FUNCTION down()`)

	// A key Redis holds completed needs no PostgreSQL: it replays while
	// the breaker is closed.
	if res, err := g.Do(bg, k("done"), "fp", pay); err != nil || !res.Replayed || runs != 0 {
		t.Fatalf("done with the backstop down, breaker closed: %q replayed %t, %v, %d runs; want Redis's replay",
			res.Value, res.Replayed, err, runs)
	}
	for _, id := range []string{"new1", "new2"} {
		res, err := g.Do(bg, k(id), "fp", pay)
		switch policy {
		case fallback.FailClosed:
			if !isUnavailable(err) || runs != 0 {
				t.Fatalf("%s with the backstop down: %q, %v, %d runs; want ErrUnavailable, nothing run", id, res.Value, err, runs)
			}
		case fallback.FailOpen:
			// Run unguarded; its commit needs the backstop, which is down.
			if !isUnavailable(err) || runs == 0 {
				t.Fatalf("%s with the backstop down: %q, %v, %d runs; want an unguarded run whose commit fails", id, res.Value, err, runs)
			}
		}
	}
	if s.State() != fallback.StateOpen || opened != 1 {
		t.Fatalf("breaker %s (opened %d times); want it opened by the backstop's outage", s.State(), opened)
	}
	runs = 0
	res, err := g.Do(bg, k("done"), "fp", pay)
	switch policy {
	case fallback.FailClosed:
		if !errors.Is(err, fallback.ErrBreakerOpen) || runs != 0 {
			t.Fatalf("done with the breaker open: %q, %v, %d runs; want ErrBreakerOpen", res.Value, err, runs)
		}
		return
	case fallback.FailOpen:
		if !isUnavailable(err) || runs != 1 {
			t.Fatalf("done with the breaker open: %q, %v, %d runs; want an unguarded run whose commit fails", res.Value, err, runs)
		}
	}

	// FailOpen: PostgreSQL is back, the breaker still open.
	pgenv.Exec(t, db, `DROP TRIGGER down ON idemguard_keys`)
	runs = 0
	if res, err := g.Do(bg, k("done"), "fp", pay); err != nil || string(res.Value) != "paid done" || runs != 1 {
		t.Fatalf("done, fail-open, backstop back: %q, %v, %d runs; want the stored payment replayed by the commit", res.Value, err, runs)
	}
	if _, err := g.Do(bg, k("held"), "fp", pay); !errors.Is(err, backstop.ErrStaleFence) {
		t.Fatalf("held, fail-open, backstop back: %v; want ErrStaleFence beside its holder", err)
	}
	if res, err := pay(bg, held.Lease); err != nil || string(res) != "paid held" {
		t.Fatalf("the holder's own payment: %q, %v", res, err)
	}
	if rows, keys := pgenv.CountPayments(t, db); rows != 2 || keys != 2 {
		t.Fatalf("payments: %d rows for %d keys; want one for done and one for held", rows, keys)
	}
}

// TestBreakerOpenLogsCause: the warning that the breaker opened names the
// failure that opened it. Over backstop.Wrap that may be PostgreSQL, not
// Redis: an operator told only "primary store unavailable" looks at a
// Redis that answers.
func TestBreakerOpenLogsCause(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s := newStore(t, backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b), fallback.Options{FailuresToOpen: 1, OpenTimeout: time.Hour, Logger: logger})
	pgenv.Exec(t, db, `CREATE FUNCTION down() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN RAISE EXCEPTION 'simulated outage' USING ERRCODE = '57P03'; END $$`)
	pgenv.Exec(t, db, `CREATE TRIGGER down BEFORE INSERT OR UPDATE ON idemguard_keys FOR EACH ROW EXECUTE FUNCTION down()`)
	if _, err := s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: "down", ID: "k"}, Token: "T", Fingerprint: "fp",
		Lease: time.Second, TTL: time.Minute}); !isUnavailable(err) || s.State() != fallback.StateOpen {
		t.Fatalf("claim with PostgreSQL down = %v, breaker %s; want ErrUnavailable, open", err, s.State())
	}
	if out := logs.String(); !strings.Contains(out, "breaker open") || !strings.Contains(out, "simulated outage") {
		t.Fatalf("the breaker's warning does not name its cause: %s", out)
	}
}

// TestFailOpenBackstopBlipsRace: FailOpen over backstop.Wrap, Redis up,
// PostgreSQL refusing the keys table's writes in blips (on for 60 ms, off
// for 90 ms). Keys keep arriving, each raced by four callers that retry
// until answered: claims go through Redis and the mark, or, once the
// backstop's failures opened the breaker, unguarded. Every key is paid
// once and every caller answered its payment: Backstop.Commit's row keeps
// the effects single where the guard did not.
//
// The blips, the breaker's OpenTimeout and the guard's lease are one
// scale (testenv.OnTime): at load 20–27, 6 runs of 9 left keys unpaid
// after 30 s (6 to 39 of the 40 paid), their claims not answered within
// the 1 s lease ("no answer within the lease's validity"). Such a round
// runs again with all of them twice as long (at 180 ms every one passed). A key left unanswered in a
// round where no call ran past its bound still fails, and so does a
// second payment of a key in any round.
func TestFailOpenBackstopBlipsRace(t *testing.T) {
	t.Parallel()
	testenv.OnTime(t, "a gap between blips", 90*time.Millisecond, 3, func(gap time.Duration) bool {
		return failOpenBlipsRace(t, gap)
	})
}

// failOpenBlipsRace runs TestFailOpenBackstopBlipsRace with blips gap
// apart, and reports whether it was late: keys went unanswered and some
// call of the round ran past its bound (the lease, the breaker's Timeout).
func failOpenBlipsRace(t *testing.T, gap time.Duration) (late bool) {
	blip, lease := gap*2/3, gap*100/9 // 60 ms and 1 s for 90 ms
	db := pgenv.Migrated(t, pgstore.Options{})
	b := paymentsBackstop(t, db)
	s := newStore(t, backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b), fallback.Options{
		Policy: fallback.FailOpen, FailuresToOpen: 3, OpenTimeout: gap * 10 / 9, Logger: quiet})
	// A holder whose commit a blip refused fails, and the failure's end of
	// its mark's lease may be refused too: the key then waits that lease
	// out (Wrap's documented cost), so the lease is short.
	g := guard.New(s, guard.Options{Lease: lease})
	var unguarded atomic.Int64
	pay := b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		if fallback.Unguarded(l) {
			unguarded.Add(1)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.ID, l.Fence); err != nil {
			return nil, err
		}
		time.Sleep(20 * time.Millisecond) // the payment provider's answer: the workload, not synchronisation
		return []byte("paid " + l.Key.ID), nil
	})
	pgenv.Exec(t, db, `CREATE TABLE down (on_ bool NOT NULL)`)
	pgenv.Exec(t, db, `INSERT INTO down VALUES (false)`)
	pgenv.Exec(t, db, `CREATE FUNCTION down() RETURNS trigger LANGUAGE plpgsql AS
		$$ BEGIN IF (SELECT on_ FROM down) THEN RAISE EXCEPTION 'simulated outage' USING ERRCODE = '57P03'; END IF; RETURN NEW; END $$`)
	pgenv.Exec(t, db, `CREATE TRIGGER down BEFORE INSERT OR UPDATE ON idemguard_keys FOR EACH ROW EXECUTE FUNCTION down()`)

	stop := make(chan struct{})
	var blips sync.WaitGroup
	set := func(on bool) {
		if _, err := db.ExecContext(bg, `UPDATE down SET on_ = $1`, on); err != nil {
			t.Errorf("blip: %v", err) // not Fatal: this is not the test's goroutine
		}
	}
	blips.Go(func() {
		for on := true; ; on = !on {
			set(on)
			select {
			case <-stop:
				set(false)
				return
			case <-time.After(map[bool]time.Duration{true: blip, false: gap}[on]):
			}
		}
	})
	const keys, racers = 40, 4
	var (
		wg         sync.WaitGroup
		mu         sync.Mutex
		unanswered []string // a key and its last error, for each caller never answered
		overran    atomic.Int64
	)
	for i := range keys {
		id := fmt.Sprintf("k%d", i)
		for range racers {
			wg.Go(func() {
				deadline := time.Now().Add(30 * time.Second)
				var err error
				for time.Now().Before(deadline) {
					var res guard.Result
					res, err = g.Do(bg, guard.Key{Scope: "blip", ID: id}, "fp", pay)
					if err == nil {
						if string(res.Value) != "paid "+id {
							t.Errorf("%s answered %q", id, res.Value)
						}
						return
					}
					if errors.Is(err, context.DeadlineExceeded) {
						overran.Add(1) // a store call ran past its bound: the lease's validity, Timeout
					}
					time.Sleep(10 * time.Millisecond) // a client's retry pause
				}
				mu.Lock()
				unanswered = append(unanswered, fmt.Sprintf("%s: %v", id, err))
				mu.Unlock()
			})
		}
		time.Sleep(10 * time.Millisecond) // the arrival rate of new keys
	}
	wg.Wait()
	close(stop)
	blips.Wait()
	rows, paid := pgenv.CountPayments(t, db)
	if rows != paid {
		t.Errorf("payments: %d rows for %d keys: a key paid twice", rows, paid)
	}
	if len(unanswered) > 0 {
		if overran.Load() > 0 {
			t.Logf("%d callers unanswered after 30 s, %d calls ran past their bound (%d keys paid): the machine is late for blips %s apart",
				len(unanswered), overran.Load(), paid, gap)
			return true
		}
		for _, u := range unanswered {
			t.Errorf("no answer within 30 s, though no call ran past its bound: %s", u)
		}
	}
	if paid != keys {
		t.Errorf("payments: %d rows for %d keys, want one for each of %d", rows, paid, keys)
	}
	if unguarded.Load() == 0 {
		t.Errorf("no effect ran unguarded: no claim met the breaker open, so the race this test is for did not happen")
	}
	t.Logf("%d unguarded runs", unguarded.Load())
	return false
}
