package occ

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"
	"time"
)

// pgxError has the shape of pgx's *pgconn.PgError: the classification must
// work from its SQLState method alone, without importing pgx.
type pgxError struct{ code string }

func (e *pgxError) Error() string    { return "ERROR: (SQLSTATE " + e.code + ")" }
func (e *pgxError) SQLState() string { return e.code }

func TestClassifyBySQLState(t *testing.T) {
	ctx := context.Background()
	for code, want := range map[string]error{
		"40001": ErrConflict, "40P01": ErrConflict,
		"08006": ErrUnavailable, "08001": ErrUnavailable, "53300": ErrUnavailable, "57P01": ErrUnavailable, "57P03": ErrUnavailable,
		"23505": nil, "42P01": nil, "57014": nil,
	} {
		raw := fmt.Errorf("driver: %w", &pgxError{code})
		err := dbErr(ctx, "test", raw)
		for _, s := range []error{ErrConflict, ErrUnavailable} {
			if errors.Is(err, s) != (s == want) {
				t.Errorf("SQLSTATE %s: errors.Is(%v, %v) = %v", code, err, s, errors.Is(err, s))
			}
		}
		var pe *pgxError
		if !errors.As(err, &pe) || pe.code != code {
			t.Errorf("SQLSTATE %s: the driver's error is lost from %v", code, err)
		}
		if IsConflict(raw) != (want == ErrConflict) {
			t.Errorf("IsConflict(raw %s) = %v", code, IsConflict(raw))
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := dbErr(cctx, "test", context.Canceled); !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) {
		t.Errorf("cancelled = %v", err)
	}
	if dbErr(ctx, "test", nil) != nil {
		t.Error("dbErr(nil) != nil")
	}
}

// TestBadConnAfterContextEndedIsTheContexts: when a call's context ends,
// lib/pq sends a cancel request and answers 57014, or, when the
// cancellation races with the connection, a bad connection
// (driver.ErrBadConn): either is the context's end, as the database/sql
// layer answers for a call that never began, not ErrUnavailable (the ops
// trial: TestUpdateCancelled could answer "database unavailable"). With
// the context alive, a bad connection stays ErrUnavailable.
func TestBadConnAfterContextEndedIsTheContexts(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for name, tc := range map[string]struct {
		ctx  context.Context
		want error
		not  error
	}{
		"cancelled": {cancelled, context.Canceled, ErrUnavailable},
		"deadline":  {expired, context.DeadlineExceeded, ErrUnavailable},
		"alive":     {context.Background(), ErrUnavailable, context.Canceled},
	} {
		err := dbErr(tc.ctx, "update", fmt.Errorf("exec: %w", driver.ErrBadConn))
		if !errors.Is(err, tc.want) || errors.Is(err, tc.not) {
			t.Errorf("%s: %v; want %v, not %v", name, err, tc.want, tc.not)
		}
		if !errors.Is(err, driver.ErrBadConn) {
			t.Errorf("%s: the driver's error is lost from %v", name, err)
		}
	}
}
