package pgstore

import (
	"context"
	"database/sql"

	"github.com/idemguard/idemguard/internal/pgsql"
)

// The Store's statements run one at a time, each in a transaction of its
// own (a claim that changes a record: one at READ COMMITTED, whatever the
// database's default). At READ COMMITTED, PostgreSQL's default, they never
// fail for a race. On a database whose default_transaction_isolation is
// REPEATABLE READ or SERIALIZABLE, a statement that loses a race to another
// (two claims of a new key, a claim and a completion) fails with a
// serialization failure (40001), or a deadlock (40P01): it was rolled back
// and changed nothing, so it is run again (pgsql.RetryLostRace). One that
// keeps failing is reported as guard.ErrUnavailable (dbErr).

// exec runs a statement of its own, again after a serialization failure.
func (s *Store) exec(ctx context.Context, q string, args ...any) (res sql.Result, err error) {
	err = pgsql.RetryLostRace(ctx, func() error {
		res, err = s.db.ExecContext(ctx, q, args...)
		return err
	})
	return res, err
}

// queryRow runs a statement of its own that reads one row into dest, again
// after a serialization failure.
func (s *Store) queryRow(ctx context.Context, q string, args []any, dest ...any) error {
	return pgsql.RetryLostRace(ctx, func() error { return s.db.QueryRowContext(ctx, q, args...).Scan(dest...) })
}
