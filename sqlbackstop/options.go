package sqlbackstop

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/lib/pq"

	"github.com/idemguard/idemguard/guard"
)

// DefaultTablePrefix starts the name of every table, index and the
// schema-version table the package creates.
const DefaultTablePrefix = "idemguard_"

// maxIdentLen is PostgreSQL's NAMEDATALEN-1: longer names are truncated by
// the server, and truncated names can collide.
const maxIdentLen = 63

// Options name where the package's tables live and how long rows are kept.
// The zero value is ready to use.
type Options struct {
	// Schema holds the tables. Empty means the connection's search_path
	// (names are left unqualified); otherwise Migrate creates it if needed.
	Schema string
	// TablePrefix starts every table and index name. Default
	// DefaultTablePrefix ("idemguard_"): tables idemguard_keys,
	// idemguard_consumed_messages, idemguard_webhook_deliveries,
	// idemguard_steps and idemguard_schema_migrations.
	TablePrefix string
	// TTL is how long a row written by Backstop.Commit, Backstop marks and
	// MarkConsumed is kept before it counts as expired and Purge may delete
	// it. Keep it at least as long as the guard's TTL. Default
	// guard.DefaultTTL (24h).
	TTL time.Duration
}

func (o Options) withDefaults() Options {
	if o.TablePrefix == "" {
		o.TablePrefix = DefaultTablePrefix
	}
	if o.TTL <= 0 {
		o.TTL = guard.DefaultTTL
	}
	return o
}

// longest suffix appended to TablePrefix for a table or index name.
const longestSuffix = "webhook_deliveries_pending_key"

// Validate reports whether the options make usable SQL names: no NUL
// bytes, and no name longer than PostgreSQL's 63-byte limit.
func (o Options) Validate() error {
	o = o.withDefaults()
	if strings.ContainsRune(o.Schema, 0) || strings.ContainsRune(o.TablePrefix, 0) {
		return fmt.Errorf("sqlbackstop: schema and table prefix must not contain NUL bytes")
	}
	if len(o.Schema) > maxIdentLen {
		return fmt.Errorf("sqlbackstop: schema %q is %d bytes, PostgreSQL allows %d", o.Schema, len(o.Schema), maxIdentLen)
	}
	if n := len(o.TablePrefix) + len(longestSuffix); n > maxIdentLen {
		return fmt.Errorf("sqlbackstop: table prefix %q is too long: names would be %d bytes, PostgreSQL allows %d",
			o.TablePrefix, n, maxIdentLen)
	}
	return nil
}

// tables holds the quoted SQL names built from Options.
type tables struct {
	Keys, Consumed, Webhooks, Versions     string // qualified, quoted table names
	KeysExpiresIndex, ConsumedExpiresIndex string // unqualified, quoted index names
	ConsumedUnique, WebhooksPendingIndex   string
	Steps, StepsExpiresIndex               string // steps.go: qualified table, index
	Schema                                 string // quoted schema, or "" for search_path
	lockKey                                string // advisory-lock key for migrations
}

func newTables(o Options) tables {
	o = o.withDefaults()
	qual := func(name string) string {
		if o.Schema == "" {
			return pq.QuoteIdentifier(name)
		}
		return pq.QuoteIdentifier(o.Schema) + "." + pq.QuoteIdentifier(name)
	}
	p := o.TablePrefix
	t := tables{
		Keys:                 qual(p + "keys"),
		Consumed:             qual(p + "consumed_messages"),
		Webhooks:             qual(p + "webhook_deliveries"),
		Versions:             qual(p + "schema_migrations"),
		KeysExpiresIndex:     pq.QuoteIdentifier(p + "keys_expires_at_idx"),
		ConsumedExpiresIndex: pq.QuoteIdentifier(p + "consumed_messages_expires_at_idx"),
		ConsumedUnique:       pq.QuoteIdentifier(p + "consumed_messages_group_message_key"),
		WebhooksPendingIndex: pq.QuoteIdentifier(p + longestSuffix),
		Steps:                qual(p + "steps"),
		StepsExpiresIndex:    pq.QuoteIdentifier(p + "steps_expires_at_idx"),
		lockKey:              "idemguard:" + o.Schema + "." + p,
	}
	if o.Schema != "" {
		t.Schema = pq.QuoteIdentifier(o.Schema)
	}
	return t
}

// Querier is what the helpers that take one run their statements on:
// *sql.DB, *sql.Tx and *sql.Conn all satisfy it.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ Querier = (*sql.DB)(nil)
	_ Querier = (*sql.Tx)(nil)
	_ Querier = (*sql.Conn)(nil)
)

// SQL fragments for the database clock. statement_timestamp() is the
// server's time at the start of the statement: leases and retention are
// measured by one clock, the database's, never the callers'.
const (
	clockNow = "statement_timestamp()"
)

// dur renders a parameter holding microseconds as an interval.
func dur(param string) string { return "(" + param + "::float8 * interval '1 microsecond')" }

// untilUS renders the microseconds from now until the timestamp expression ts.
func untilUS(ts string) string {
	return "floor(extract(epoch from (" + ts + " - " + clockNow + ")) * 1000000)::bigint"
}
