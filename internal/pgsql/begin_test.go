package pgsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"testing"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
	"github.com/idemguard/idemguard/internal/testenv"
)

// refusingBegin is a connector to a real server whose connections refuse
// to begin a transaction with err, as a server refuses a feature it does
// not support; every other statement reaches the server.
type refusingBegin struct {
	driver.Connector
	err error
}

func (c refusingBegin) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return refusingConn{cn, c.err}, nil
}

type refusingConn struct {
	driver.Conn
	err error
}

func (c refusingConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return nil, c.err
}

// TestBeginTxRecoveryOnly: a transaction refused with 0A000
// (feature_not_supported) is unavailable only on a server in recovery,
// which BeginTx asks (pg_is_in_recovery()): on a primary it is the
// driver's plain error, for a feature no retry brings. (The server in
// recovery is tested in pgstore and backstop: TestHotStandbyUnavailable,
// TestHotStandbyFuncUnavailable.)
func TestBeginTxRecoveryOnly(t *testing.T) {
	_, dsn := testenv.Postgres(t)
	pc, err := pq.NewConnector(dsn)
	if err != nil {
		t.Fatal(err)
	}
	refusal := stateErr("0A000")
	db := sql.OpenDB(refusingBegin{pc, refusal})
	defer db.Close()
	ctx := context.Background()
	tx, err := pgsql.BeginTx(ctx, db, nil)
	if tx != nil || !errors.Is(err, refusal) {
		t.Fatalf("BeginTx refused = %v, %v; want the refusal", tx, err)
	}
	if pgsql.Unavailable(err) || pgsql.ReadOnly(err) || errors.Is(pgsql.Err(ctx, "begin", err), guard.ErrUnavailable) {
		t.Errorf("a 0A000 on a primary = %v: unavailable; want a plain error", pgsql.Err(ctx, "begin", err))
	}
}
