package fallback_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestFailOpenCommitsThroughBackstop: FailOpen over backstop.Wrap, Redis
// dead. The effect runs unguarded (the policy's promise), and its
// Backstop.Func still commits the key's row in the business transaction:
// the first run commits its payment, a duplicate run during the outage
// replays it without a second payment, and once Redis is back (empty)
// the key replays from PostgreSQL. Refused for its fence 0, the unguarded
// lease failed every effect instead: neither guarded nor run.
func TestFailOpenCommitsThroughBackstop(t *testing.T) {
	t.Parallel()
	p := newPrimary(t)
	db := pgenv.Migrated(t, pgstore.Options{})
	b := paymentsBackstop(t, db)
	s := newStore(t, backstop.Wrap(p.store, b), fallback.Options{
		Policy: fallback.FailOpen, FailuresToOpen: 1, OpenTimeout: time.Hour, Timeout: 3 * time.Second, Logger: quiet,
	})
	g := guard.New(s, guard.Options{Lease: 5 * time.Second})
	key := guard.Key{Scope: "pay", ID: t.Name()}
	ran := 0
	fn := b.Func("fp", func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		ran++
		if !fallback.Unguarded(l) {
			t.Errorf("lease %+v is guarded; want the fail-open one", l)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO payments (key, fence) VALUES ($1, $2)`, key.String(), l.Fence)
		return []byte("receipt"), err
	})

	p.srv.Kill()
	for i := range 2 {
		res, err := g.Do(bg, key, "fp", fn)
		if err != nil || string(res.Value) != "receipt" {
			t.Fatalf("fail-open Do %d = %q, %v; want the receipt", i, res.Value, err)
		}
	}
	if rows, _ := pgenv.CountPayments(t, db); ran != 2 || rows != 1 {
		t.Fatalf("effect ran %d times, payments %d; want 2 unguarded runs and 1 payment", ran, rows)
	}

	// Redis back, empty; the breaker is opened for good above, so claim
	// through Wrap directly: the key replays from PostgreSQL.
	p.srv.Restart()
	res, err := guard.New(backstop.Wrap(p.store, b), guard.Options{Lease: 5 * time.Second}).Do(bg, key, "fp", fn)
	if err != nil || !res.Replayed || string(res.Value) != "receipt" || ran != 2 {
		t.Fatalf("after the outage: %q replayed %v, %v, effect ran %d times; want a replay", res.Value, res.Replayed, err, ran)
	}
}
