// Package sqlstate classifies PostgreSQL errors by their SQLSTATE code and
// by what database/sql reports of a broken connection, whatever the driver:
// lib/pq's *pq.Error and pgx's *pgconn.PgError both have a SQLState
// method, so no driver is imported. The backstop, the Postgres store and
// occ share it.
package sqlstate

import (
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
)

// Code returns the SQLSTATE code of the first error in err's chain that
// carries one, and whether there was one.
func Code(err error) (string, bool) {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState(), true
	}
	return "", false
}

// Retryable reports a serialization failure (40001) or a deadlock
// (40P01): the transaction lost a race and may be run again from its start.
func Retryable(err error) bool {
	code, _ := Code(err)
	return code == "40001" || code == "40P01"
}

// UndefinedTable reports a table or other relation that does not exist
// (42P01, undefined_table): the schema was never migrated, or the
// connection looks in another schema (search_path, Options.Schema).
func UndefinedTable(err error) bool {
	code, _ := Code(err)
	return code == "42P01"
}

// Unreachable reports whether err means the database could not be reached
// or could not do the work now but may later: SQLSTATE class 08
// (connection exception), 53 (insufficient resources) and 57P (admin or
// crash shutdown, cannot connect now); without a SQLSTATE, a bad or done
// connection, an EOF, or a network error (context.DeadlineExceeded is one:
// a driver that gave up waiting for the server).
func Unreachable(err error) bool {
	if code, ok := Code(err); ok {
		return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "53") || strings.HasPrefix(code, "57P")
	}
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}
