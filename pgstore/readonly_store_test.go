package pgstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestReadOnlyDatabaseUnavailable: a Store whose database refuses writes
// (a primary demoted to a hot standby during a failover, a role or a
// session made read only) answers every write with guard.ErrUnavailable
// naming the read-only transaction, and loses nothing: once writes are
// accepted again, the holder completes its key. (Each of these calls
// begins with a statement of its own, which the read-only session
// refuses as a hot standby does; the same calls on a private standby
// answered the same 25006.) The refusal (SQLSTATE
// 25006, read_only_sql_transaction) was a plain error, so a holder's
// completion was not retried (httpx, consumerx and backstop.Wrap retry
// only an unavailable store), fallback's breaker never opened, and a
// claim was answered as a failure of the store, not a "retry later".
func TestReadOnlyDatabaseUnavailable(t *testing.T) {
	t.Parallel()
	rw, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, rw, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	w := pgenv.Store(t, rw, pgstore.Options{})
	r := pgenv.Store(t, pgenv.ReadOnly(t, dsn), pgstore.Options{})

	held := guard.Key{Scope: "s", ID: "held"}
	req := guard.ClaimRequest{Key: held, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	out, err := w.Claim(ctx, req)
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	lease := out.Lease

	wantUnavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, guard.ErrUnavailable) || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("%s on a read-only database = %v; want guard.ErrUnavailable naming the read-only transaction", what, err)
		}
	}
	fresh := guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "fresh"}, Token: "B", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	_, err = r.Claim(ctx, fresh)
	wantUnavailable("Claim of a new key", err)
	wantUnavailable("Extend", r.Extend(ctx, lease, time.Minute))
	wantUnavailable("SaveStep", r.SaveStep(ctx, lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}))
	wantUnavailable("Complete", r.Complete(ctx, lease, []byte("done"), time.Hour))
	wantUnavailable("Fail", r.Fail(ctx, lease, "boom", time.Hour))
	wantUnavailable("Release", r.Release(ctx, lease))
	_, err = r.Purge(ctx, pgstore.PurgeOptions{})
	wantUnavailable("Purge", err)

	// Nothing was lost: the holder still holds its key, and completes it
	// once writes are accepted.
	rec, err := r.Get(ctx, held)
	if err != nil || rec.State != guard.StatePending || rec.Token != "A" {
		t.Fatalf("Get on the read-only database = %+v, %v; want A's pending record", rec, err)
	}
	if err := w.Complete(ctx, lease, []byte("done"), time.Hour); err != nil {
		t.Fatalf("Complete once writable: %v", err)
	}
	if _, err := w.Get(ctx, fresh.Key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("the refused claim left a record: %v", err)
	}
}
