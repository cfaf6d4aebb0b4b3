package pgstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
)

// DefaultTablePrefix starts the name of every table, index and the
// schema-version table the package creates.
const DefaultTablePrefix = pgsql.DefaultTablePrefix

// Options name where the tables live and how long rows are kept. The
// same Options are given to Migrate, New and backstop.New for one set of
// tables. The zero value is ready to use.
type Options struct {
	// Schema holds the tables. Empty means the connection's search_path
	// (names are left unqualified): Migrate then works on the tables in
	// the first schema of the path that holds them, or, where none does,
	// makes them in the first schema of the path that exists, where
	// PostgreSQL creates. Otherwise Migrate creates the schema if needed.
	Schema string
	// TablePrefix starts every table and index name. Default
	// DefaultTablePrefix ("idemguard_"): tables idemguard_keys,
	// idemguard_consumed_messages, idemguard_webhook_deliveries,
	// idemguard_steps and idemguard_schema_migrations.
	TablePrefix string
	// TTL is how long a row written by backstop.Backstop's Commit, and
	// by Store.MarkConsumed, is kept before it counts as expired and
	// Purge may delete it; a holder's mark (backstop.Wrap) is kept for
	// its lease and the TTL after it. Keep it at least as long as the
	// guard's TTL. Default guard.DefaultTTL (24h). (The Store's own
	// records are kept for the TTL each claim and completion names.)
	TTL time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.TablePrefix == "" {
		o.TablePrefix = DefaultTablePrefix
	}
	if o.TTL <= 0 {
		o.TTL = guard.DefaultTTL
	}
	return o
}

// Validate reports whether the options make usable SQL names: no NUL
// bytes, and no name longer than PostgreSQL's 63-byte limit.
func (o Options) Validate() error {
	return pgsql.Validate("pgstore", o.Schema, o.TablePrefix)
}

func newTables(o Options) pgsql.Tables { return pgsql.NewTables(o.Schema, o.TablePrefix) }

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

// Shorthands for the shared SQL fragments (internal/pgsql).
const (
	clockNow    = pgsql.ClockNow
	keysColumns = pgsql.KeysColumns
)

var (
	dur     = pgsql.Dur
	untilUS = pgsql.UntilUS
)

// dbErr is pgsql.Err, with a column the statement names that the table
// lacks (42703, undefined_column: tables migrated by an older release)
// saying to migrate, and a value too long for a unique index (54000,
// program_limit_exceeded: a consumed message's or a webhook delivery's
// identifiers, which nothing else bounds) saying what to do.
func dbErr(ctx context.Context, what string, err error) error {
	switch code, _ := pgsql.SQLState(err); code {
	case "42703":
		return fmt.Errorf("postgres %s: %w (%s)", what, err, oldSchemaHint)
	case "54000":
		return fmt.Errorf("postgres %s: %w (%s)", what, err, tooLongHint)
	}
	return pgsql.Err(ctx, what, err)
}

const tooLongHint = "identifiers too long for the table's unique index (2704 bytes after compression, as StoredText keeps them): " +
	"pass a digest of a long message id or reference (SHA-256, say) instead"

const oldSchemaHint = "the tables lack a column: an older release migrated them; " +
	"bring them to the latest version with pgstore.Migrate or the command idemguard migrate up, given the same Schema and TablePrefix"
