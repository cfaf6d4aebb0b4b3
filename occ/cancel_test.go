package occ_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/occ"
)

// TestUpdateCancelled: an update waiting for a row lock when its context
// is cancelled answers an error matching context.Canceled, as dbErr's
// comment says, whatever the driver made of the cancellation (lib/pq
// reports PostgreSQL's 57014, "canceling statement due to user request").
func TestUpdateCancelled(t *testing.T) {
	t.Parallel()
	db := database(t)
	acc := accountsTable(t, db)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	var holder int
	if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid() FROM occ_accounts WHERE id = 1 FOR UPDATE`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := acc.Update(cctx, db, 1, 1, map[string]any{"balance": 0})
		done <- err
	}()
	// Cancel once the update waits for the lock.
	testenv.WaitFor(t, 30*time.Second, "the update to wait for the row lock", func() bool {
		var n int
		_ = db.QueryRowContext(ctx, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&n)
		return n > 0
	})
	cancel()
	err = <-done
	if !errors.Is(err, context.Canceled) || occ.IsConflict(err) || errors.Is(err, occ.ErrUnavailable) {
		t.Fatalf("Update cancelled while it waited = %v, want an error matching context.Canceled", err)
	}
}

// TestRetryOnConflictContextCause: RetryOnConflict ended by its context
// returns the context's error, as its comment says, also for a context
// cancelled with a cause (context.WithCancelCause, WithTimeoutCause):
// errors.Is(err, context.Canceled) holds, and the cause is kept beside it.
// backoff hands back context.Cause alone, which matched neither.
func TestRetryOnConflictContextCause(t *testing.T) {
	t.Parallel()
	cause := errors.New("shutting down")
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tries := 0
	err := occ.RetryOnConflict(cctx, occ.RetryOptions{InitialInterval: time.Microsecond}, func(context.Context) error {
		tries++
		if tries == 2 {
			cancel(cause)
		}
		return occ.ErrConflict
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || occ.IsConflict(err) || tries != 2 {
		t.Fatalf("RetryOnConflict cancelled = %v after %d tries, want an error matching context.Canceled and its cause after 2", err, tries)
	}
}

// TestRetryOnConflictCancelledBefore: a context cancelled with a cause
// before RetryOnConflict is called (or between tries, as RetryOnConflict
// looks before each) also ends it with the context's error and its cause.
// The look before each try returned ctx.Err() alone: the cause was lost.
func TestRetryOnConflictCancelledBefore(t *testing.T) {
	t.Parallel()
	cause := errors.New("shutting down")
	cctx, cancel := context.WithCancelCause(ctx)
	cancel(cause)
	tries := 0
	err := occ.RetryOnConflict(cctx, occ.RetryOptions{}, func(context.Context) error {
		tries++
		return nil
	})
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || tries != 0 {
		t.Fatalf("RetryOnConflict on a cancelled context = %v after %d tries, want an error matching context.Canceled and its cause, no try", err, tries)
	}
}

// fieldErrors is a cause of an uncomparable type, as validators' error
// lists are (a slice type with an Error method).
type fieldErrors []string

func (e fieldErrors) Error() string { return "invalid: " + strings.Join(e, ", ") }

// TestRetryOnConflictUncomparableCause: a context cancelled with a cause
// of an uncomparable type ends RetryOnConflict with the context's error
// and the cause, as any other. Telling the cause backoff hands back by ==
// panicked: comparing uncomparable type occ_test.fieldErrors.
func TestRetryOnConflictUncomparableCause(t *testing.T) {
	t.Parallel()
	cause := fieldErrors{"amount"}
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	tries := 0
	err := occ.RetryOnConflict(cctx, occ.RetryOptions{InitialInterval: time.Microsecond}, func(context.Context) error {
		tries++
		if tries == 2 {
			cancel(cause)
		}
		return occ.ErrConflict
	})
	var fe fieldErrors
	if !errors.Is(err, context.Canceled) || !errors.As(err, &fe) || occ.IsConflict(err) {
		t.Fatalf("RetryOnConflict cancelled = %v, want an error matching context.Canceled and its cause", err)
	}
}
