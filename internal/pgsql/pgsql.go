// Package pgsql holds what packages backstop and pgstore share about
// idemguard's PostgreSQL tables: their quoted names, the SQL fragments
// that read the database's clock, and the classification of driver errors
// into the guard's vocabulary. It imports database/sql only, never a
// driver: errors are classified through their SQLSTATE code, which lib/pq
// (*pq.Error) and pgx (*pgconn.PgError) both expose as SQLState().
package pgsql

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// DefaultTablePrefix starts the name of every table and index when the
// caller names no prefix.
const DefaultTablePrefix = "idemguard_"

// MaxIdentLen is PostgreSQL's NAMEDATALEN-1: longer names are truncated by
// the server, and truncated names can collide.
const MaxIdentLen = 63

// longestSuffix is the longest suffix appended to the prefix for a table
// or index name.
const longestSuffix = "webhook_deliveries_pending_key"

// Validate reports whether schema and prefix (after defaults) make usable
// SQL names: no NUL bytes, and no name longer than PostgreSQL's limit.
// errPrefix starts each message (the calling package's name).
func Validate(errPrefix, schema, prefix string) error {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if strings.ContainsRune(schema, 0) || strings.ContainsRune(prefix, 0) {
		return fmt.Errorf("%s: schema and table prefix must not contain NUL bytes", errPrefix)
	}
	if len(schema) > MaxIdentLen {
		return fmt.Errorf("%s: schema %q is %d bytes, PostgreSQL allows %d", errPrefix, schema, len(schema), MaxIdentLen)
	}
	if n := len(prefix) + len(longestSuffix); n > MaxIdentLen {
		return fmt.Errorf("%s: table prefix %q is too long: names would be %d bytes, PostgreSQL allows %d",
			errPrefix, prefix, n, MaxIdentLen)
	}
	return nil
}

// QuoteIdent quotes name as an SQL identifier: inside double quotes, with
// every double quote doubled. (The names are checked by Validate: no NUL.)
func QuoteIdent(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Tables holds the quoted SQL names of the tables and indexes for one
// schema and prefix. The field names are those the migration templates
// use ({{.Keys}}, …): renaming one breaks the embedded migrations.
type Tables struct {
	Keys, Consumed, Webhooks, Versions     string // qualified, quoted table names
	KeysExpiresIndex, ConsumedExpiresIndex string // unqualified, quoted index names
	ConsumedUnique, WebhooksPendingIndex   string
	Steps, StepsExpiresIndex               string // qualified table, index
	Schema                                 string // quoted schema, or "" for search_path
	Prefix                                 string // the table prefix, unquoted
	LockKey                                string // advisory-lock key for migrations
}

// LockKey is the advisory-lock key of the migrations of the tables of
// prefix in schema (unquoted): one key per set of tables, however the
// schema was named (Options.Schema, or found through the search_path).
func LockKey(schema, prefix string) string { return "idemguard:" + schema + "." + prefix }

// NewTables returns the names for schema ("" means the connection's
// search_path) and prefix ("" means DefaultTablePrefix).
func NewTables(schema, prefix string) Tables {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	qual := func(name string) string {
		if schema == "" {
			return QuoteIdent(name)
		}
		return QuoteIdent(schema) + "." + QuoteIdent(name)
	}
	p := prefix
	t := Tables{
		Keys:                 qual(p + "keys"),
		Consumed:             qual(p + "consumed_messages"),
		Webhooks:             qual(p + "webhook_deliveries"),
		Versions:             qual(p + "schema_migrations"),
		KeysExpiresIndex:     QuoteIdent(p + "keys_expires_at_idx"),
		ConsumedExpiresIndex: QuoteIdent(p + "consumed_messages_expires_at_idx"),
		ConsumedUnique:       QuoteIdent(p + "consumed_messages_group_message_key"),
		WebhooksPendingIndex: QuoteIdent(p + longestSuffix),
		Steps:                qual(p + "steps"),
		StepsExpiresIndex:    QuoteIdent(p + "steps_expires_at_idx"),
		Prefix:               p,
		LockKey:              LockKey(schema, p),
	}
	if schema != "" {
		t.Schema = QuoteIdent(schema)
	}
	return t
}

// ClockNow is the database's clock in a statement. statement_timestamp() is
// the server's time at the start of the statement: leases and retention are
// measured by one clock, the database's, never the callers'.
const ClockNow = "statement_timestamp()"

// KeysColumns are the columns of a fresh keys row, in INSERT order.
const KeysColumns = `(scope, id, fingerprint, status, token, fence, attempt, recovered, result, last_error, leased_until, created_at, expires_at)`

// Dur renders a parameter holding microseconds as an interval.
func Dur(param string) string { return "(" + param + "::float8 * interval '1 microsecond')" }

// Span renders the time from timestamp expression from to timestamp
// expression to as an interval of seconds. to - from would be one of days
// once it reaches 24 hours, and a day added to a timestamptz is a calendar
// day of the session's TimeZone: 23 or 25 hours across a daylight-saving
// change.
func Span(from, to string) string {
	return "((extract(epoch from " + to + ") - extract(epoch from " + from + "))::float8 * interval '1 second')"
}

// UntilUS renders the microseconds from now until the timestamp expression ts.
func UntilUS(ts string) string {
	return "floor(extract(epoch from (" + ts + " - " + ClockNow + ")) * 1000000)::bigint"
}

// Micros is us microseconds (from UntilUS) as a Duration, saturated at
// the longest one: a row kept for centuries (a lease or retention near
// the longest Duration, extended) would otherwise overflow into a
// negative one.
func Micros(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}
