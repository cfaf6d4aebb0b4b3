package pgstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/idemguard/idemguard/internal/pgsql"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one schema change with its rollback, as SQL rendered for
// the Options it was built with.
type Migration struct {
	Version int    // applied in ascending order, recorded in the schema-version table
	Name    string // from the file name, e.g. "keys"
	Up      string // the SQL that applies it
	Down    string // the SQL that undoes it
}

// Migrator applies the package's migrations to one database. Each step
// runs in its own transaction under an advisory lock, and records its
// version in the schema-version table in that transaction, so a step is
// applied entirely or not at all, and concurrent migrators take turns.
type Migrator struct {
	db         *sql.DB
	t          pgsql.Tables
	migrations []Migration
}

// NewMigrator returns a Migrator for the tables opts names. It returns an
// error for a nil db and for options that make no usable names.
func NewMigrator(db *sql.DB, opts Options) (*Migrator, error) {
	if db == nil {
		return nil, errors.New("pgstore.NewMigrator: nil *sql.DB")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	t := newTables(opts)
	ms, err := loadMigrations(t)
	if err != nil {
		return nil, err
	}
	return &Migrator{db: db, t: t, migrations: ms}, nil
}

// Migrate applies every migration not yet applied. Running it again is a
// no-op. A nil db is an error.
func Migrate(ctx context.Context, db *sql.DB, opts Options) error {
	m, err := NewMigrator(db, opts)
	if err != nil {
		return err
	}
	return m.Up(ctx)
}

// MigrateDown undoes every applied migration, newest first, and drops the
// schema-version table: the tables and every row in them are gone. A nil
// db is an error.
func MigrateDown(ctx context.Context, db *sql.DB, opts Options) error {
	m, err := NewMigrator(db, opts)
	if err != nil {
		return err
	}
	return m.Down(ctx)
}

// Migrations returns the migrations in the order Up applies them.
func (m *Migrator) Migrations() []Migration { return append([]Migration(nil), m.migrations...) }

// Latest is the version Up brings the database to.
func (m *Migrator) Latest() int { return m.migrations[len(m.migrations)-1].Version }

// Up applies every pending migration.
func (m *Migrator) Up(ctx context.Context) error {
	for {
		moved, err := m.step(ctx, +1)
		if err != nil || !moved {
			return err
		}
	}
}

// Down undoes every applied migration and drops the schema-version table.
// Where nothing was migrated, it changes nothing (it makes neither the
// schema nor the version table).
func (m *Migrator) Down(ctx context.Context) error {
	for {
		moved, err := m.step(ctx, -1)
		if err != nil {
			return err
		}
		if !moved {
			break
		}
	}
	if ok, err := m.migrated(ctx); !ok || err != nil {
		return err // nothing migrated (or another Down dropped the table): nothing to drop
	}
	return m.inLockedTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM `+m.t.Versions).Scan(&n); err != nil {
			return err
		}
		if n != 0 { // another migrator applied something meanwhile: leave the table
			return nil
		}
		_, err := tx.ExecContext(ctx, `DROP TABLE `+m.t.Versions)
		return err
	})
}

// Steps applies n pending migrations (n > 0) or undoes -n applied ones
// (n < 0). Asking for more steps than there are is an error, after the
// possible ones were made.
func (m *Migrator) Steps(ctx context.Context, n int) error {
	dir := 1
	if n < 0 {
		dir, n = -1, -n
	}
	for i := range n {
		moved, err := m.step(ctx, dir)
		if err != nil {
			return err
		}
		if !moved {
			return fmt.Errorf("pgstore: only %d of %d migration steps were possible", i, n)
		}
	}
	return nil
}

// Version returns the newest applied migration. Versions start at 1, so
// 0, without an error, means nothing is migrated in the tables the
// Options name: no schema-version table there (never migrated, migrated
// down, or another Schema or TablePrefix) or an empty one. Version only
// reads, in a read-only transaction: it works on a hot standby and for a
// role whose transactions are read only, and it neither creates the
// schema nor the version table, nor waits for a migration under way (it
// reads the versions the migrators have committed; each step commits its
// tables and its version together).
func (m *Migrator) Version(ctx context.Context) (int, error) {
	v, _, err := m.read(ctx)
	return v, err
}

// read is Version, and whether the version table exists.
func (m *Migrator) read(ctx context.Context) (v int, exists bool, err error) {
	// READ COMMITTED whatever the default: a hot standby refuses
	// SERIALIZABLE transactions.
	tx, err := m.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true})
	if err != nil {
		return 0, false, dbErr(ctx, "schema version", err)
	}
	defer func() { _ = tx.Rollback() }()
	// The version table as it is named, in the schema or in the
	// search_path; NULL when it (or its schema) does not exist.
	if err := tx.QueryRowContext(ctx, `SELECT to_regclass($1) IS NOT NULL`, m.t.Versions).Scan(&exists); err != nil {
		return 0, false, dbErr(ctx, "schema version", err)
	}
	if !exists {
		return 0, false, nil
	}
	v, err = m.current(ctx, tx)
	if code, _ := pgsql.SQLState(err); code == "42P01" {
		return 0, false, nil // dropped meanwhile by a migration down
	}
	if err != nil {
		return 0, false, dbErr(ctx, "schema version", err)
	}
	return v, true, nil
}

// migrated reports whether the version table exists: where it does not,
// nothing was migrated (or everything was undone), and a migration down
// has nothing to undo. It only reads, so a migration down of tables
// never migrated makes neither the schema nor the version table (which
// inLockedTx makes).
func (m *Migrator) migrated(ctx context.Context) (bool, error) {
	_, exists, err := m.read(ctx)
	return exists, err
}

// step applies the next migration (dir +1) or undoes the newest (dir -1).
// It reports false when there was nothing to do.
func (m *Migrator) step(ctx context.Context, dir int) (moved bool, err error) {
	if dir < 0 {
		if ok, err := m.migrated(ctx); !ok || err != nil {
			return false, err
		}
	}
	err = m.inLockedTx(ctx, func(tx *sql.Tx) error {
		cur, err := m.current(ctx, tx)
		if err != nil {
			return err
		}
		if dir > 0 {
			for _, mg := range m.migrations {
				if mg.Version <= cur {
					continue
				}
				if _, err := tx.ExecContext(ctx, mg.Up); err != nil {
					return fmt.Errorf("migration %d_%s up: %w", mg.Version, mg.Name, err)
				}
				if _, err := tx.ExecContext(ctx, `INSERT INTO `+m.t.Versions+` (version, name) VALUES ($1, $2)`, mg.Version, mg.Name); err != nil {
					return err
				}
				moved = true
				return nil
			}
			return nil
		}
		for i := len(m.migrations) - 1; i >= 0; i-- {
			mg := m.migrations[i]
			if mg.Version != cur {
				continue
			}
			if _, err := tx.ExecContext(ctx, mg.Down); err != nil {
				return fmt.Errorf("migration %d_%s down: %w", mg.Version, mg.Name, err)
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+m.t.Versions+` WHERE version = $1`, mg.Version); err != nil {
				return err
			}
			moved = true
			return nil
		}
		if cur != 0 {
			return fmt.Errorf("pgstore: database is at version %d, which this build does not know", cur)
		}
		return nil
	})
	return moved, err
}

func (m *Migrator) current(ctx context.Context, tx *sql.Tx) (int, error) {
	var v sql.NullInt64
	if err := tx.QueryRowContext(ctx, `SELECT max(version) FROM `+m.t.Versions).Scan(&v); err != nil {
		return 0, err
	}
	return int(v.Int64), nil
}

// inLockedTx runs fn in a transaction that holds the migration lock and in
// which the schema and the schema-version table exist. The transaction is
// READ COMMITTED whatever the database's default: under a stricter level
// its snapshot would be taken by the statement that waits for the lock,
// and a migrator that waited would not see the versions the one before it
// committed.
func (m *Migrator) inLockedTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := pgsql.BeginTx(ctx, m.db, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return dbErr(ctx, "migrate", err)
	}
	defer func() { _ = tx.Rollback() }()
	lockKey := m.t.LockKey
	var found string // with no Schema: the schema the search_path gives the tables
	if m.t.Schema == "" {
		// Where the version table the search_path finds is, else where
		// CREATE would make it (the first schema of the path that
		// exists). A CREATE TABLE IF NOT EXISTS looks in that second
		// schema only: with the tables in a later schema of the path
		// (public, behind a "$user" schema made since), it would make an
		// empty version table before them, and every migration again,
		// and the Store would read the new, empty tables from then on.
		var s sql.NullString
		if err := tx.QueryRowContext(ctx, `SELECT coalesce((SELECT n.nspname FROM pg_class c
			JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)), current_schema())`,
			m.t.Versions).Scan(&s); err != nil {
			return dbErr(ctx, "migrate schema", err)
		}
		if s.Valid {
			// The lock of those tables, as a migrator naming the schema
			// takes it: the two take turns.
			found, lockKey = s.String, pgsql.LockKey(s.String, m.t.Prefix)
		}
	}
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, lockKey); err != nil {
		return dbErr(ctx, "migrate lock", err)
	}
	if found != "" {
		// The tables are made, read and changed in that schema; the rest
		// of the path stays as it was for what the migrations call.
		if _, err := tx.ExecContext(ctx, `SELECT set_config('search_path', $1 || ', ' || current_setting('search_path'), true)`,
			pgsql.QuoteIdent(found)); err != nil {
			return dbErr(ctx, "migrate schema", err)
		}
	}
	if m.t.Schema != "" {
		// Migrators of other prefixes in this schema hold other locks:
		// this one makes their CREATE SCHEMA IF NOT EXISTS take turns
		// (run at once, all but one fail on the catalog's unique index).
		if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idemguard:schema:"+m.t.Schema); err != nil {
			return dbErr(ctx, "migrate lock", err)
		}
		if _, err := tx.ExecContext(ctx, `CREATE SCHEMA IF NOT EXISTS `+m.t.Schema); err != nil {
			return dbErr(ctx, "create schema", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+m.t.Versions+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return dbErr(ctx, "create version table", err)
	}
	if err := fn(tx); err != nil {
		return dbErr(ctx, "migrate", err)
	}
	return dbErr(ctx, "migrate commit", tx.Commit())
}

// loadMigrations reads the embedded NNNN_name.up.sql / .down.sql pairs and
// renders the table names into them.
func loadMigrations(t pgsql.Tables) ([]Migration, error) {
	entries, err := fs.Glob(migrationFiles, "migrations/*.up.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, up := range entries {
		base := strings.TrimSuffix(path.Base(up), ".up.sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("pgstore: migration file %s is not NNNN_name.up.sql", up)
		}
		upSQL, err := render(up, t)
		if err != nil {
			return nil, err
		}
		downSQL, err := render(strings.TrimSuffix(up, ".up.sql")+".down.sql", t)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: name, Up: upSQL, Down: downSQL})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := range ms {
		if ms[i].Version != i+1 {
			return nil, fmt.Errorf("pgstore: migration versions are not 1..n: %d at position %d", ms[i].Version, i+1)
		}
	}
	return ms, nil
}

func render(file string, t pgsql.Tables) (string, error) {
	b, err := migrationFiles.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("pgstore: migration %s: %w", file, err)
	}
	tpl, err := template.New(file).Option("missingkey=error").Parse(string(b))
	if err != nil {
		return "", fmt.Errorf("pgstore: migration %s: %w", file, err)
	}
	var sb strings.Builder
	if err := tpl.Execute(&sb, t); err != nil {
		return "", fmt.Errorf("pgstore: migration %s: %w", file, err)
	}
	return sb.String(), nil
}
