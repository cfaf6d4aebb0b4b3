package sqlstate

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
)

// pgError is a server error as drivers report one: lib/pq's and pgx's both
// have this method.
type pgError struct{ code string }

func (e pgError) Error() string    { return "pg: " + e.code }
func (e pgError) SQLState() string { return e.code }

func TestClassification(t *testing.T) {
	wrapped := func(err error) error { return fmt.Errorf("insert: %w", err) }
	for _, tc := range []struct {
		err         error
		retryable   bool
		unreachable bool
	}{
		{wrapped(pgError{"40001"}), true, false},
		{wrapped(pgError{"40P01"}), true, false},
		{wrapped(pgError{"08006"}), false, true},
		{pgError{"53300"}, false, true},
		{pgError{"57P01"}, false, true},
		{pgError{"23505"}, false, false}, // a unique violation is an answer
		{pgError{"42P01"}, false, false},
		{wrapped(driver.ErrBadConn), false, true},
		{sql.ErrConnDone, false, true},
		{io.ErrUnexpectedEOF, false, true},
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, false, true},
		{context.DeadlineExceeded, false, true},
		{errors.New("syntax"), false, false},
	} {
		if got := Retryable(tc.err); got != tc.retryable {
			t.Errorf("Retryable(%v) = %v", tc.err, got)
		}
		if got := Unreachable(tc.err); got != tc.unreachable {
			t.Errorf("Unreachable(%v) = %v", tc.err, got)
		}
	}
	if code, ok := Code(wrapped(pgError{"23505"})); !ok || code != "23505" {
		t.Errorf("Code = %q, %v", code, ok)
	}
	if _, ok := Code(io.EOF); ok {
		t.Error("Code found a SQLSTATE in io.EOF")
	}
	for err, want := range map[error]bool{
		pgError{"42P01"}: true, wrapped(pgError{"42P01"}): true,
		pgError{"42703"}: false, pgError{"3F000"}: false, errors.New("relation does not exist"): false,
	} {
		if got := UndefinedTable(err); got != want {
			t.Errorf("UndefinedTable(%v) = %v, want %v", err, got, want)
		}
	}
}
