package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// TestHotStandbyFuncUnavailable: Func and Step on a real hot standby (a
// private primary and a standby made from it with pg_basebackup), not
// behind Wrap (whose claim the standby already refuses), answer
// guard.ErrUnavailable, and the effect does not run: the connections may
// reach a promoted primary after a failover, so the caller should retry
// later. lib/pq begins every transaction READ WRITE, which a server in
// recovery refuses with SQLSTATE 0A000 (feature_not_supported, "cannot
// set transaction read-write mode during recovery"): Func and Step
// returned it as a plain error (Do failed the key, httpx answered 500).
func TestHotStandbyFuncUnavailable(t *testing.T) {
	t.Parallel()
	pair := pgenv.StartStandby(t)
	if err := pgstore.Migrate(ctx, pair.Primary, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	pair.Replayed(t)
	b := mustBackstop(t, pair.Standby, pgstore.Options{})
	fn := func(context.Context, *sql.Tx, guard.Lease) ([]byte, error) {
		t.Error("the effect ran on a hot standby")
		return nil, nil
	}
	wantUnavailable := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, guard.ErrUnavailable) || !strings.Contains(err.Error(), "recovery") {
			t.Errorf("%s on a hot standby = %v; want guard.ErrUnavailable naming the recovery", what, err)
		}
	}
	_, err := b.Func("fp", fn)(ctx, guard.Lease{Key: newKey(t), Token: "A", Fence: 1, Attempt: 1})
	wantUnavailable("Func", err)
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	_, err = g.Do(ctx, newKey(t), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		return b.Step(ctx, l, "pay", fn)
	})
	wantUnavailable("Step", err)
}
