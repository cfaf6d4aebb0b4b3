package backstop_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// TestReadOnlyDatabaseFailsClosed: a backstop whose database refuses
// writes (a primary demoted to a hot standby in a failover, a role whose
// transactions are read only) fails closed as an unreachable one does:
// Wrap's claim is guard.ErrUnavailable, the effect does not run, and the
// primary's claim is released; Commit in a read-only transaction is
// guard.ErrUnavailable too. The refusal (SQLSTATE 25006) was a plain
// error: a fallback.Store over the wrapped store did not count it against
// its breaker, and adapters answered it as a failure (500), not "retry
// later" (503).
func TestReadOnlyDatabaseFailsClosed(t *testing.T) {
	t.Parallel()
	rw, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, rw, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	b := mustBackstop(t, pgenv.ReadOnly(t, dsn), pgstore.Options{})
	primary := memstore.New(memstore.Options{})
	g := guard.New(backstop.Wrap(primary, b), guard.Options{})
	key := newKey(t)
	wantUnavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, guard.ErrUnavailable) || !strings.Contains(err.Error(), "read-only") {
			t.Errorf("%s on a read-only database = %v; want guard.ErrUnavailable naming the read-only transaction", what, err)
		}
	}
	_, err := g.Do(ctx, key, "fp", notRun(t))
	wantUnavailable("Do over Wrap", err)
	if _, err := primary.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("the primary's claim was not released: %v", err)
	}

	// lib/pq begins a transaction READ WRITE unless asked otherwise,
	// whatever the session's default (a hot standby refuses to begin it).
	tx, err := b.DB().BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	wantUnavailable("Commit", b.Commit(ctx, tx, guard.Lease{Key: key, Token: "A", Fence: 1, Attempt: 1}, "fp", []byte("r")))
}
