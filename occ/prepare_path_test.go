package occ_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"
	"testing"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// preparePathDriver is lib/pq behind a connection whose QueryContext
// declines (driver.ErrSkip), as drivers and driver wrappers without a
// direct query path do: database/sql then prepares the statement and
// converts its arguments a second time, calling each driver.Valuer twice
// for a statement it sends once.
type preparePathDriver struct{}

func (preparePathDriver) Open(dsn string) (driver.Conn, error) {
	c, err := pq.Driver{}.Open(dsn)
	if err != nil {
		return nil, err
	}
	return preparePathConn{c}, nil
}

type preparePathConn struct{ driver.Conn }

func (preparePathConn) QueryContext(context.Context, string, []driver.NamedValue) (driver.Rows, error) {
	return nil, driver.ErrSkip
}

var registerPreparePath = sync.OnceFunc(func() { sql.Register("occ-test-prepare-path", preparePathDriver{}) })

// preparePathDB is a *sql.DB on dsn through preparePathDriver, closed at
// t's end.
func preparePathDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	registerPreparePath()
	db, err := sql.Open("occ-test-prepare-path", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// beginRepeatableRead begins a REPEATABLE READ transaction on db, rolled back
// at t's end unless committed.
func beginRepeatableRead(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback() })
	if _, err := tx.ExecContext(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	return tx
}

// TestVersionedConflictPreparePath: on a driver that takes database/sql's
// prepare path, a plain conflict (the row moved on; the update was sent
// once and matched no row) must still match ErrConflict, so UpdateRetry
// tries again. The send count of Update's version argument reads 2 there
// (two conversions, one send); on a connection of Update's own (a
// *sql.DB's), a *sql.Conn or a *sql.Tx database/sql never sends a
// statement again, so the count says nothing, and the conflict read as
// ErrUnavailable ("sent 2 times: may have applied"), which it was not.
func TestVersionedConflictPreparePath(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	acc := accountsTable(t, direct)
	db := preparePathDB(t, dsn)

	if _, err := acc.Update(ctx, db, 1, 1, map[string]any{"balance": 110}); err != nil {
		t.Fatalf("Update at version 1: %v", err)
	}
	_, err := acc.Update(ctx, db, 1, 1, map[string]any{"balance": 120})
	if !errors.Is(err, occ.ErrConflict) || errors.Is(err, occ.ErrUnavailable) {
		t.Fatalf("Update at a stale version on the prepare path = %v, want ErrConflict", err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := acc.Update(ctx, conn, 1, 1, map[string]any{"balance": 120}); !errors.Is(err, occ.ErrConflict) {
		t.Fatalf("Update at a stale version on a *sql.Conn on the prepare path = %v, want ErrConflict", err)
	}

	// UpdateRetry, its first read stale: tried again, applied once.
	stale := true
	_, err = acc.UpdateRetry(ctx, db, 1, occ.RetryOptions{}, func(ctx context.Context) (int64, map[string]any, error) {
		balance, version := readAccount(t, direct)
		if stale {
			stale, version = false, version-1
		}
		return version, map[string]any{"balance": balance + 10}, nil
	})
	if err != nil {
		t.Fatalf("UpdateRetry after a stale read on the prepare path: %v", err)
	}
	if b, v := readAccount(t, direct); b != 120 || v != 3 {
		t.Fatalf("balance %d at version %d, want 120 at 3", b, v)
	}
}

// TestVectorSerializationFailurePreparePath: a vector write in a
// REPEATABLE READ transaction on a driver that takes database/sql's
// prepare path, racing another writer, fails with PostgreSQL's
// serialization failure; the write was sent once, so it must match
// ErrConflict (the transaction is run again), not ErrUnavailable.
func TestVectorSerializationFailurePreparePath(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	tbl := cartsTable(t, direct, "w")
	base, err := tbl.Write(ctx, direct, "c", occ.Vector{}, []byte(`["a"]`))
	if err != nil {
		t.Fatal(err)
	}
	db := preparePathDB(t, dsn)
	tx := beginRepeatableRead(t, db)
	if _, err := tbl.Read(ctx, tx, "c"); err != nil { // the snapshot
		t.Fatal(err)
	}
	other := occ.VectorTable{Name: tbl.Name, ValueColumn: tbl.ValueColumn, Writer: "x"}
	if _, err := other.Write(ctx, direct, "c", base, []byte(`["a","b"]`)); err != nil {
		t.Fatal(err)
	}
	_, err = tbl.Write(ctx, tx, "c", base, []byte(`["a","c"]`))
	if !occ.IsConflict(err) || errors.Is(err, occ.ErrUnavailable) {
		t.Fatalf("Write racing another writer in a REPEATABLE READ transaction on the prepare path = %v, want ErrConflict", err)
	}
}

// TestVectorCreateSerializationFailurePreparePath: the insert of a new row
// in a REPEATABLE READ transaction, on the prepare path, racing another
// writer that created the row after the transaction's snapshot: the
// serialization failure of the insert (sent once) must match ErrConflict.
func TestVectorCreateSerializationFailurePreparePath(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	tbl := cartsTable(t, direct, "w")
	db := preparePathDB(t, dsn)
	tx := beginRepeatableRead(t, db)
	if _, err := tbl.Read(ctx, tx, "d"); !errors.Is(err, occ.ErrNotFound) { // the snapshot
		t.Fatalf("Read of a row not created yet = %v", err)
	}
	other := occ.VectorTable{Name: tbl.Name, ValueColumn: tbl.ValueColumn, Writer: "x"}
	if _, err := other.Write(ctx, direct, "d", occ.Vector{}, []byte(`["b"]`)); err != nil {
		t.Fatal(err)
	}
	_, err := tbl.Write(ctx, tx, "d", occ.Vector{}, []byte(`["c"]`))
	if !occ.IsConflict(err) || errors.Is(err, occ.ErrUnavailable) {
		t.Fatalf("creating Write racing another writer in a REPEATABLE READ transaction on the prepare path = %v, want ErrConflict", err)
	}
}
