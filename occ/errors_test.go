package occ_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/occ"
)

// TestRetryOnConflictSerializable: a SERIALIZABLE transaction that loses
// to a concurrent commit fails with SQLSTATE 40001 at its update;
// RetryOnConflict takes the driver's raw error for a conflict and runs the
// transaction again, which then sees the committed row.
func TestRetryOnConflictSerializable(t *testing.T) {
	t.Parallel()
	db := database(t)
	mustExec(t, db, `CREATE TABLE occ_counter (id int PRIMARY KEY, n bigint NOT NULL)`)
	mustExec(t, db, `INSERT INTO occ_counter VALUES (1, 0)`)
	var tries int
	var first error
	err := occ.RetryOnConflict(ctx, occ.RetryOptions{}, func(ctx context.Context) error {
		tries++
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelSerializable})
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		var n int64
		if err := tx.QueryRowContext(ctx, `SELECT n FROM occ_counter WHERE id = 1`).Scan(&n); err != nil {
			return err
		}
		if tries == 1 { // another writer commits after this transaction's snapshot
			mustExec(t, db, `UPDATE occ_counter SET n = n + 1 WHERE id = 1`)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE occ_counter SET n = $1 WHERE id = 1`, n+1); err != nil {
			if first == nil {
				first = err
			}
			return err // the driver's error as it is
		}
		return tx.Commit()
	})
	var pe *pq.Error
	if !errors.As(first, &pe) || pe.Code != "40001" || !occ.IsConflict(first) || errors.Is(first, occ.ErrConflict) {
		t.Fatalf("first try's error = %v, want lib/pq's 40001", first)
	}
	var n int64
	if err := db.QueryRowContext(ctx, `SELECT n FROM occ_counter WHERE id = 1`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err != nil || tries != 2 || n != 2 {
		t.Fatalf("RetryOnConflict = %v after %d tries, counter %d; want nil after 2, counter 2", err, tries, n)
	}

	// Through occ: a versioned update in a REPEATABLE READ transaction
	// that loses the race is classified as ErrConflict, SQLSTATE kept.
	acc := occ.VersionedTable{Name: "occ_counter"}
	mustExec(t, db, `ALTER TABLE occ_counter ADD COLUMN version bigint NOT NULL DEFAULT 1`)
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var v int64
	if err := tx.QueryRowContext(ctx, `SELECT version FROM occ_counter WHERE id = 1`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if _, err := acc.Update(ctx, db, 1, v, map[string]any{"n": 10}); err != nil {
		t.Fatal(err)
	}
	_, err = acc.Update(ctx, tx, 1, v, map[string]any{"n": 20})
	if !errors.Is(err, occ.ErrConflict) || !errors.As(err, &pe) || pe.Code != "40001" {
		t.Fatalf("versioned update that lost in REPEATABLE READ = %v", err)
	}
}

// TestUnavailable: a server that is not there, and a connection the server
// ended, are ErrUnavailable; neither is a conflict to retry blindly.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	db := database(t)
	tbl := cartsTable(t, db, "w")

	gone, err := sql.Open("postgres", "postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if _, err := tbl.Read(ctx, gone, "c"); !errors.Is(err, occ.ErrUnavailable) || occ.IsConflict(err) {
		t.Errorf("Read from a closed port = %v, want ErrUnavailable", err)
	}

	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var pid int
	if err := conn.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `SELECT pg_terminate_backend($1)`, pid)
	_, err = tbl.Write(ctx, conn, "c", occ.Vector{}, []byte(`[]`))
	if !errors.Is(err, occ.ErrUnavailable) || occ.IsConflict(err) {
		t.Errorf("Write on a terminated connection = %v, want ErrUnavailable", err)
	}
	if _, err := tbl.Read(ctx, db, "c"); !errors.Is(err, occ.ErrNotFound) {
		t.Errorf("after the failed write, Read = %v, want ErrNotFound", err)
	}
}
