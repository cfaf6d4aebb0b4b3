package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapUnmarkSurvivesStatementCutOff: a holder's Fail (a declined
// effect) or Release (a first attempt rejected before any effect) reaches
// PostgreSQL, and the statement that ends its lease on its mark is cut
// off (cancelled while it waits: statement_timeout under load, an
// operator's pg_cancel_backend). The holder's mark must still lose its
// lease: a retry of the key then runs its effect at once, exactly once.
// The unmark was one try, which the cut-off statement failed (SQLSTATE
// 57014): the mark stayed leased for the rest of a lease nobody held, and
// every retry was told the key was in progress (409) for a minute.
func TestWrapUnmarkSurvivesStatementCutOff(t *testing.T) {
	t.Parallel()
	admin, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, admin, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	app := "unmark_cut_" + newKey(t).ID
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	pool, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Close() })

	b := mustBackstop(t, pool, pgstore.Options{})
	g := guard.New(backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b), guard.Options{Lease: time.Minute})

	// cut runs end (a holder's Fail or Release) with its unmark's
	// statement cut off: a transaction holds the key's row, so the
	// statement waits, and it is cancelled while it waits
	// (pg_cancel_backend, SQLSTATE 57014, as statement_timeout cuts off a
	// statement under load); then the row is let go. (Ending the backend
	// instead is no failure: lib/pq answers driver.ErrBadConn to a FATAL,
	// and database/sql runs the statement again on another connection.)
	cut := func(t *testing.T, key guard.Key, end func() error) {
		t.Helper()
		locker, err := admin.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = locker.Rollback() }()
		if _, err := locker.ExecContext(ctx, `SELECT 1 FROM idemguard_keys WHERE scope = $1 AND id = $2 FOR UPDATE`, key.Scope, key.ID); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- end() }()
		var pid int
		var started string
		const waiting = `FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`
		testenv.WaitFor(t, 10*time.Second, "the unmark to wait for the row", func() bool {
			err := admin.QueryRowContext(ctx, `SELECT pid, query_start::text `+waiting, app).Scan(&pid, &started)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				t.Fatal(err)
			}
			return err == nil
		})
		if _, err := admin.ExecContext(ctx, `SELECT pg_cancel_backend($1)`, pid); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the unmark's statement to be cancelled", func() bool {
			var n int
			if err := admin.QueryRowContext(ctx, `SELECT count(*) `+waiting+` AND pid = $2 AND query_start::text = $3`, app, pid, started).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 0
		})
		_ = locker.Rollback()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// retry is the client's retry of key: it must run the effect at once.
	retry := func(t *testing.T, key guard.Key) {
		t.Helper()
		var runs atomic.Int32
		v, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			runs.Add(1)
			return []byte("paid"), nil
		})
		if err != nil || string(v.Value) != "paid" || runs.Load() != 1 {
			t.Fatalf("retry after the blip = %q, %v, %d runs; want paid at once, one run", v.Value, err, runs.Load())
		}
	}

	for _, c := range []struct {
		name string
		end  func(guard.Lease) error
	}{
		{"fail", func(l guard.Lease) error { return g.Fail(ctx, l, errors.New("declined")) }},
		{"release", func(l guard.Lease) error { return g.Release(ctx, l) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := newKey(t)
			claim, err := g.Claim(ctx, key, "fp")
			if err != nil {
				t.Fatal(err)
			}
			cut(t, key, func() error { return c.end(claim.Lease) })
			retry(t, key)
		})
	}
}
