package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// TestFuncReturnsContextCause: a Func or Step whose transaction ends with
// its context, ended by the guard (the lease lost, MaxRun reached), returns
// an error matching that cause, as guard.Do's doc asks of an fn ("an fn
// that returns its context's cause"), and nothing is committed. It
// returned a bare context.Canceled, so Do answered "context canceled" to
// a caller whose own context was alive (read as a client that went away)
// when the guard had ended the run: seen with a pool of one connection,
// where the holder's lease extensions waited for the connection the
// effect's transaction held until the lease ran out.
func TestFuncReturnsContextCause(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	pgenv.PaymentsTable(t, db)
	b := mustBackstop(t, db, pgstore.Options{})
	// The effect is made, then its context ends (as the guard ends it)
	// before it returns success: the commit finds the transaction ended.
	endedBy := func(cancel context.CancelCauseFunc) func(context.Context, *sql.Tx, guard.Lease) ([]byte, error) {
		return func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
			if _, err := payFn(ctx, tx, l); err != nil {
				return nil, err
			}
			cancel(guard.ErrLeaseLost)
			return []byte("paid"), nil
		}
	}
	g := guard.New(memstore.New(memstore.Options{}), guard.Options{})
	for name, run := range map[string]func() error{
		"Func": func() error {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			_, err := b.Func("fp", endedBy(cancel))(ctx, guard.Lease{Key: newKey(t), Token: "A", Fence: 1, Attempt: 1})
			return err
		},
		"Step": func() error {
			var err error
			_, _ = g.Do(context.Background(), newKey(t), "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
				ctx, cancel := context.WithCancelCause(ctx)
				defer cancel(nil)
				_, err = b.Step(ctx, l, "pay", endedBy(cancel))
				return nil, err
			})
			return err
		},
	} {
		if err := run(); !errors.Is(err, guard.ErrLeaseLost) || !errors.Is(err, context.Canceled) {
			t.Errorf("%s whose context the guard ended = %v; want its cause, guard.ErrLeaseLost (and context.Canceled)", name, err)
		}
	}

	// End to end: Do's run ended at MaxRun answers ErrMaxRun, not a bare
	// "context canceled".
	// The effect waits for its context to end, then returns success.
	waitFn := func(ctx context.Context, tx *sql.Tx, l guard.Lease) ([]byte, error) {
		if _, err := payFn(ctx, tx, l); err != nil {
			return nil, err
		}
		<-ctx.Done()
		return []byte("paid"), nil
	}
	g = guard.New(memstore.New(memstore.Options{}), guard.Options{MaxRun: 50 * time.Millisecond})
	_, err := g.Do(ctx, newKey(t), "fp", b.Func("fp", waitFn))
	if !errors.Is(err, guard.ErrMaxRun) {
		t.Errorf("Do of a Func past MaxRun = %v; want guard.ErrMaxRun", err)
	}
	if rows, _ := pgenv.CountPayments(t, db); rows != 0 {
		t.Errorf("%d payments committed by runs the guard ended; want 0", rows)
	}
}
