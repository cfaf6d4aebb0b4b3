package pgsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/idemguard/idemguard/guard"
)

// sqlStater is what a PostgreSQL driver's server error provides: lib/pq's
// *pq.Error (since v1.10) and pgx's *pgconn.PgError both have it.
type sqlStater interface{ SQLState() string }

// SQLState returns the SQLSTATE code of the first error in err's chain
// that carries one, and whether there was one.
func SQLState(err error) (string, bool) {
	var s sqlStater
	if errors.As(err, &s) {
		return s.SQLState(), true
	}
	return "", false
}

// Err maps a database error to the guard's vocabulary: a connection that
// failed, a server shutting down or out of resources, a serialization
// failure or a deadlock wraps guard.ErrUnavailable (the call may be made
// again); a cancelled context is returned as it is; anything else is
// wrapped plainly. what names the operation in the message.
func Err(ctx context.Context, what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return err
	}
	if Unavailable(err) {
		return fmt.Errorf("%w: postgres %s: %w", guard.ErrUnavailable, what, err)
	}
	return fmt.Errorf("postgres %s: %w", what, err)
}

// Unavailable reports whether err means the database could not do the
// work now but may later: SQLSTATE class 08 (connection exception), 53
// (insufficient resources), 57P (admin or crash shutdown, cannot connect
// now), 40001 (serialization failure) and 40P01 (deadlock); a bad or done
// connection, an EOF, a deadline or a network error.
func Unavailable(err error) bool {
	if code, ok := SQLState(err); ok {
		return strings.HasPrefix(code, "08") || // connection exception
			strings.HasPrefix(code, "53") || // insufficient resources
			strings.HasPrefix(code, "57P") || // admin/crash shutdown, cannot connect now
			code == "40001" || code == "40P01" // serialization failure, deadlock: try again
	}
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne)
}
