package backstop_test

import (
	"context"
	"database/sql"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/pgstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

// mustBackstop returns a Backstop on db, failing the test if New refuses.
func mustBackstop(t testing.TB, db *sql.DB, opts pgstore.Options) *backstop.Backstop {
	t.Helper()
	b, err := backstop.New(db, opts)
	if err != nil {
		t.Fatalf("backstop.New: %v", err)
	}
	return b
}

// notRun is an effect that must not run: the call replays, or is refused
// before it claims (Do panics on a nil Func).
func notRun(t testing.TB) guard.Func {
	return func(context.Context, guard.Lease) ([]byte, error) {
		t.Error("the effect ran")
		return nil, nil
	}
}
