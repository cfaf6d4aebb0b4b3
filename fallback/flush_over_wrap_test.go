package fallback_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
)

// TestFlushOverWrapRace: the recommended composition (fallback over
// backstop.Wrap, pgstore's Store on the same tables as the secondary,
// switch-back checks on as after an outage) while Redis forgets keys
// under running holders: every key's first two runs flush Redis
// (FLUSHALL) from inside the effect, the first then fails. All keys race
// at once, eight callers each. No run of a key may start beside another,
// each key is paid once, every answer is its receipt, and afterwards
// every key replays its receipt without running.
func TestFlushOverWrapRace(t *testing.T) {
	t.Parallel()
	p := newPrimary(t)
	pg, db := pgStore(t)
	b := paymentsBackstop(t, db)
	s := newStore(t, backstop.Wrap(p.store, b), fallback.Options{Policy: fallback.Secondary, Secondary: pg,
		Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet})
	s.ConsultSecondary(time.Now().Add(time.Hour))
	g := guard.New(s, guard.Options{Lease: 3 * time.Second})
	flusher := p.srv.Client()

	const keys, racers = 12, 8
	type state struct {
		mu             sync.Mutex
		inflight, runs int
	}
	states := make([]state, keys)
	var total sync.WaitGroup
	fn := b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		var k int
		if _, err := fmt.Sscanf(l.Key.ID, "k%d", &k); err != nil {
			return nil, err
		}
		st := &states[k]
		st.mu.Lock()
		st.inflight++
		st.runs++
		run := st.runs
		if st.inflight > 1 {
			t.Errorf("%s: run %d (fence %d) beside another run", l.Key.ID, run, l.Fence)
		}
		st.mu.Unlock()
		defer func() { st.mu.Lock(); st.inflight--; st.mu.Unlock() }()
		if run <= 2 {
			if err := flusher.FlushAll(context.WithoutCancel(ctx)).Err(); err != nil {
				t.Errorf("FLUSHALL: %v", err)
			}
		}
		if run == 1 {
			return nil, errors.New("declined")
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, l.Key.ID, l.Fence)
		time.Sleep(30 * time.Millisecond) // the payment provider's answer: the workload, not synchronisation
		return []byte("receipt-" + l.Key.ID), err
	})
	for k := range keys {
		key := guard.Key{Scope: "flush", ID: fmt.Sprintf("k%d", k)}
		for range racers {
			total.Go(func() {
				deadline := time.Now().Add(30 * time.Second)
				for time.Now().Before(deadline) {
					res, err := g.Do(bg, key, "fp", fn)
					if err == nil {
						if want := "receipt-" + key.ID; string(res.Value) != want {
							t.Errorf("%s answered %q, want %q", key.ID, res.Value, want)
						}
						return
					}
					// The run that declined, a lease the flush took, a
					// stale fence, in progress: ask again, as a client would.
					time.Sleep(20 * time.Millisecond) // a client's retry pause
				}
				t.Errorf("%s: no answer within 30 s", key.ID)
			})
		}
	}
	total.Wait()
	for k := range keys {
		key := guard.Key{Scope: "flush", ID: fmt.Sprintf("k%d", k)}
		res, err := g.Do(bg, key, "fp", notRun(t))
		if err != nil || !res.Replayed || string(res.Value) != "receipt-"+key.ID {
			t.Errorf("%s afterwards: %q replayed %t, %v", key.ID, res.Value, res.Replayed, err)
		}
	}
	if rows, paid := pgenv.CountPayments(t, db); rows != keys || paid != keys {
		t.Errorf("payments: %d rows for %d keys, want one for each of %d", rows, paid, keys)
	}
}

// notRun is an effect that must not run: the call replays.
func notRun(t testing.TB) guard.Func {
	return func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("the effect ran")
		return nil, nil
	}
}
