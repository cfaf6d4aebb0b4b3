package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/idemguard/idemguard/internal/sqlstate"
	"github.com/idemguard/idemguard/lock"
	"github.com/idemguard/idemguard/pgstore"
)

// purgeLockName starts the Redlock name under which at most one purge of
// the same tables runs (purgeLock).
const purgeLockName = "idemguard-purge"

func addPostgresFlags(fs *flag.FlagSet) (dsn, schema, tablePrefix *string) {
	dsn = fs.String("postgres", "", "PostgreSQL URL, e.g. postgres://user@host:5432/db?sslmode=disable (required)")
	schema = fs.String("schema", "", "schema of the backstop tables (default: the connection's search_path)")
	tablePrefix = addTablePrefixFlag(fs)
	return dsn, schema, tablePrefix
}

// addTablePrefixFlag is --table-prefix: the TablePrefix given to
// pgstore.Options or backstop.Options, which starts every table's name.
func addTablePrefixFlag(fs *flag.FlagSet) *string {
	return fs.String("table-prefix", pgstore.DefaultTablePrefix, "the `prefix` of the tables' names (pgstore.Options.TablePrefix, backstop.Options.TablePrefix; empty: the default)")
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("migrate")
	dsn, schema, tablePrefix := addPostgresFlags(fs)
	force := fs.Bool("force", false, "down: drop the tables although their rows are lost with them")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	switch {
	case fs.NArg() == 0:
		return usagef("want one direction, up or down, after the flags")
	case fs.NArg() > 1:
		return usagef("want one direction, up or down, after the flags, got %q", strings.Join(fs.Args(), " "))
	case fs.Arg(0) != "up" && fs.Arg(0) != "down":
		return usagef("%q: want one direction, up or down, after the flags", fs.Arg(0))
	}
	if *dsn == "" {
		return usagef("--postgres is required")
	}
	if fs.Arg(0) == "down" && !*force {
		// Down undoes every migration: the tables go, and with them every
		// committed key the backstop would replay after Redis forgot it.
		where := "the connection's search_path"
		if *schema != "" {
			where = "schema " + *schema
		}
		return usagef("down drops every idemguard table in %s with its rows: the backstop forgets every committed key, "+
			"and a retry Redis has forgotten runs its effect again; add --force to do it", where)
	}
	opts := pgstore.Options{Schema: *schema, TablePrefix: *tablePrefix}
	if err := opts.Validate(); err != nil {
		return usagef("%v", err)
	}
	db, err := openPostgres(ctx, *dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	m, err := pgstore.NewMigrator(db, opts)
	if err != nil {
		return err
	}
	before, migrated, err := appliedVersion(ctx, db, opts)
	if err != nil {
		return fmt.Errorf("read the schema version: %w", err)
	}
	if fs.Arg(0) == "up" && before > m.Latest() {
		// Up would find nothing to do and say so as if all was well.
		return fmt.Errorf("the database is at schema version %d, newer than this build knows (latest %d): "+
			"a newer idemguard migrated it; use that one", before, m.Latest())
	}
	switch {
	case fs.Arg(0) == "up":
		err = m.Up(ctx)
	case migrated:
		err = m.Down(ctx)
	default:
		// Never migrated: nothing to undo, and Down would make the
		// schema (and a version table) to look for what to undo.
	}
	if err != nil {
		return fmt.Errorf("migrate %s: %w", fs.Arg(0), err)
	}
	after, _, err := appliedVersion(ctx, db, opts)
	if err != nil {
		return fmt.Errorf("read the schema version: %w", err)
	}
	fmt.Fprintf(stdout, "migrated %s: schema version %d -> %d (latest %d)\n", fs.Arg(0), before, after, m.Latest())
	return nil
}

// appliedVersion is the newest migration applied to the tables opts
// names, as Migrator.Version reads it, and whether their version table
// exists (0 and false when it does not: never migrated, or migrated
// down). It makes nothing, as Migrator.Version does not; runMigrate runs
// a down only when the table exists, since Migrator.Down makes the schema
// and the version table to look for what to undo.
func appliedVersion(ctx context.Context, db *sql.DB, opts pgstore.Options) (version int, exists bool, err error) {
	prefix := opts.TablePrefix
	if prefix == "" {
		prefix = pgstore.DefaultTablePrefix
	}
	// The table as the Migrator names it: in the schema, or unqualified
	// (the search_path).
	var table sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT to_regclass(CASE WHEN $1 = '' THEN quote_ident($2)
		ELSE quote_ident($1) || '.' || quote_ident($2) END)::text`, opts.Schema, prefix+"schema_migrations").Scan(&table); err != nil {
		return 0, false, err
	}
	if !table.Valid {
		return 0, false, nil
	}
	var v sql.NullInt64
	err = db.QueryRowContext(ctx, `SELECT max(version) FROM `+table.String).Scan(&v)
	if sqlstate.UndefinedTable(err) {
		return 0, false, nil // dropped meanwhile by a concurrent down
	}
	if err != nil {
		return 0, true, err
	}
	return int(v.Int64), true, nil
}

func runPurge(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("purge")
	dsn, schema, tablePrefix := addPostgresFlags(fs)
	before := fs.Duration("before", 0, "delete rows that expired this long ago or more (0: every expired row; a released first attempt's row is kept a minute whatever this says, for its fence)")
	batch := fs.Int("batch", pgstore.DefaultPurgeBatch, "rows deleted per statement")
	lockAddrs := fs.String("lock-addrs", "", "comma-separated independent Redis nodes: run under a Redlock singleton, so one purge of the same tables (server, database, schema) runs at a time")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case *dsn == "":
		return usagef("--postgres is required")
	case *before < 0:
		return usagef("--before %s must not be negative", *before)
	case *batch <= 0:
		return usagef("--batch %d must be positive", *batch)
	}
	opts := pgstore.Options{Schema: *schema, TablePrefix: *tablePrefix}
	if err := opts.Validate(); err != nil {
		return usagef("%v", err)
	}
	var nodes []string
	// Given, even empty (a script's unset variable), the lock is asked for.
	lockSet := false
	fs.Visit(func(f *flag.Flag) { lockSet = lockSet || f.Name == "lock-addrs" })
	if lockSet {
		nodes = splitList(*lockAddrs)
		if len(nodes) == 0 {
			return usagef("--lock-addrs %q: no node in the list", *lockAddrs)
		}
		for i, a := range nodes {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return usagef("--lock-addrs: %q is not host:port", a)
			}
			if slices.Contains(nodes[:i], a) {
				// One node would count twice towards the lock's quorum.
				return usagef("--lock-addrs: %q is given twice: give each independent node once", a)
			}
		}
	}
	db, err := openPostgres(ctx, *dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := pgstore.New(db, opts)
	if err != nil {
		return usagef("%v", err)
	}

	var deleted int64
	job := func(ctx context.Context) error {
		n, err := store.Purge(ctx, pgstore.PurgeOptions{BatchSize: *batch, Before: *before})
		deleted = n
		return err
	}
	start := time.Now()
	if len(nodes) > 0 {
		clients := lock.NewNodes(nodes...)
		defer func() {
			for _, c := range clients {
				_ = c.Close()
			}
		}()
		l, err := lock.New(clients, lock.Options{})
		if err != nil {
			return err
		}
		name, err := purgeLock(ctx, db, *dsn, *schema, *tablePrefix)
		if err != nil {
			return err
		}
		err = lock.Singleton(l, name, job)(ctx)
		switch {
		case errors.Is(err, lock.ErrNotObtained):
			fmt.Fprintf(stdout, "another purge holds the lock %q: skipped\n", name)
			return nil
		case errors.Is(err, lock.ErrUnavailable):
			return fmt.Errorf("lock nodes %s: no quorum answers: %w", strings.Join(nodes, ","), err)
		case err != nil:
			return fmt.Errorf("purge (deleted %d rows before the error): %w", deleted, err)
		}
	} else if err := job(ctx); err != nil {
		return fmt.Errorf("purge (deleted %d rows before the error): %w", deleted, err)
	}
	fmt.Fprintf(stdout, "purged %d expired rows in %s\n", deleted, time.Since(start).Round(time.Millisecond))
	return nil
}

// purgeLock is the Redlock name under which at most one purge of the
// tables dsn, schema and tablePrefix name runs: purgeLockName, the
// server, the database and the schema (as the server resolves the
// search_path when schema is empty), and a table prefix other than the
// default, so purges of other tables sharing the lock nodes do not skip
// this one. No credential is in it.
func purgeLock(ctx context.Context, db *sql.DB, dsn, schema, tablePrefix string) (string, error) {
	cfg, err := postgresConfig(dsn)
	if err != nil {
		return "", err
	}
	var database string
	var current sql.NullString
	if err := db.QueryRowContext(ctx, `SELECT current_database(), current_schema()`).Scan(&database, &current); err != nil {
		return "", fmt.Errorf("name the purge lock: %w", err)
	}
	if schema == "" {
		schema = current.String
	}
	name := fmt.Sprintf("%s:%s:%d/%s/%s", purgeLockName, cfg.Host, cfg.Port, database, schema)
	if tablePrefix != "" && tablePrefix != pgstore.DefaultTablePrefix {
		name += "/" + tablePrefix
	}
	return name, nil
}
