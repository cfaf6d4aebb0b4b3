package occ

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
)

// VectorTable names a table of the application's whose rows are entities
// written by several writers (regions, nodes, service instances), each row
// carrying a version vector beside its value. occ creates no table: the
// application's table needs
//
//   - a unique id column (PRIMARY KEY or UNIQUE; Write relies on it),
//   - a value column of a type with an equality operator (bytea, text,
//     jsonb; not json), and
//   - the vector column, jsonb NOT NULL DEFAULT '{}' (Migration's Up adds it
//     with a CHECK that keeps out what Vector cannot read).
//
// The zero value of every field but Name and Writer picks the default.
// A VectorTable is a plain value, safe for concurrent use.
type VectorTable struct {
	Schema       string // "" for the connection's search_path
	Name         string // the table; required
	IDColumn     string // the unique key column; default "id"
	VectorColumn string // the jsonb version vector; default "version_vector"
	ValueColumn  string // the entity's value; default "value"

	// Writer names this writer in the vectors: its region, node or
	// instance id. Required by Write. Two processes that may write at the
	// same time must have different ids. Goroutines of one process may
	// share an id only where equal values mean the same change (a set's
	// union, a field set to a value): their writes are told apart only by
	// value, so two of them writing the same value on the same base both
	// succeed, as one write (two deposits of 10 on 100 leave 110). Give
	// each concurrent writer of a counter or balance an id of its own.
	Writer string
}

type vectorNames struct {
	table, id, vec, val string // quoted
}

func (t VectorTable) names() (vectorNames, error) {
	table, err := tableName("VectorTable", t.Schema, t.Name)
	if err != nil {
		return vectorNames{}, err
	}
	id := orDefault(t.IDColumn, "id")
	vec := orDefault(t.VectorColumn, "version_vector")
	val := orDefault(t.ValueColumn, "value")
	if err := checkNames("VectorTable", id, vec, val); err != nil {
		return vectorNames{}, err
	}
	if id == vec || id == val || vec == val {
		return vectorNames{}, fmt.Errorf("occ: VectorTable %s: the id, vector and value columns must differ", t.Name)
	}
	return vectorNames{table, quoteIdent(id), quoteIdent(vec), quoteIdent(val)}, nil
}

// Migration returns the SQL that adds the vector column (Up) and drops it
// (Down). The table, its id and its value column are the application's.
func (t VectorTable) Migration() (Migration, error) {
	n, err := t.names()
	if err != nil {
		return Migration{}, err
	}
	return renderMigration("vector_column", map[string]string{"Table": n.table, "Column": n.vec})
}

// A Version is one version of an entity: its value and the vector it was
// written at.
type Version struct {
	Vector Vector
	Value  []byte
}

// Read returns the row's vector and value. A row that does not exist
// returns the zero Version (the empty vector) and an error matching
// ErrNotFound; writing on that empty vector creates the row. An id that
// database/sql sends as NULL (nil, a nil pointer, an invalid sql.Null…)
// names no row and is refused with an error.
func (t VectorTable) Read(ctx context.Context, q Querier, id any) (Version, error) {
	n, err := t.names()
	if err != nil {
		return Version{}, err
	}
	if q == nil {
		return Version{}, errors.New("occ: Read: nil Querier")
	}
	if err := checkID("Read", t.Name, id); err != nil {
		return Version{}, err
	}
	var v Version
	err = q.QueryRowContext(ctx, `SELECT `+n.vec+`, `+n.val+` FROM `+n.table+` WHERE `+n.id+` = $1`, id).Scan(&v.Vector, &v.Value)
	if errors.Is(err, sql.ErrNoRows) {
		return Version{}, fmt.Errorf("%w: %s id=%v", ErrNotFound, t.Name, id)
	}
	if err != nil {
		return Version{}, dbErr(ctx, "read", err)
	}
	return v, nil
}

// Write stores value in the row id at the vector base.Increment(Writer),
// if the row's stored vector is Before-or-Equal base: the caller had seen
// every write the row holds. A missing row counts as the empty vector and
// is inserted (the table's other columns need defaults). The check and the
// write are one statement: of two writers racing on the same stored vector
// exactly one succeeds, however many processes, regions or connections
// they run in. Write returns the vector it stored. An id that
// database/sql sends as NULL is refused before any statement: it names no
// row (on a UNIQUE id column each such write would insert another).
//
// When the stored vector is not Before-or-Equal base, nothing is written
// and the error is a *VectorConflictError with both vectors and both
// values, matching ErrConflict (and ErrConcurrent when the two are
// concurrent, the usual case). Merge the values, and write the merge with
// the error's MergedBase. One exception makes a repeated write harmless:
// when the row already holds exactly this write (the vector
// base.Increment(Writer) and an equal value, as after a retry whose first
// reply was lost), Write returns that vector and no error. A write that
// database/sql sent again after a lost reply (through a Querier whose
// statements reach a pool) and whose repeat failed, as with a
// serialization failure while it queued behind the first send, answers
// ErrUnavailable, not a conflict: the first send may have applied it.
//
// q may be a transaction; a write that goes through keeps the row locked
// until it ends. In a
// REPEATABLE READ or SERIALIZABLE transaction a racing write fails instead
// with PostgreSQL's serialization failure, which matches ErrConflict but
// carries no versions: run the transaction again (RetryOnConflict). Deleting
// a row is not a versioned write: a writer with an older base re-creates
// it. Store a tombstone value instead where deletes race with writes.
func (t VectorTable) Write(ctx context.Context, q Querier, id any, base Vector, value []byte) (Vector, error) {
	n, err := t.names()
	if err != nil {
		return Vector{}, err
	}
	if err := ValidWriter(t.Writer); err != nil {
		return Vector{}, fmt.Errorf("occ: VectorTable %s: Writer: %w", t.Name, err)
	}
	if q == nil {
		return Vector{}, errors.New("occ: Write: nil Querier")
	}
	if err := checkID("Write", t.Name, id); err != nil {
		return Vector{}, err
	}
	if base.Get(t.Writer) == math.MaxUint64 {
		return Vector{}, fmt.Errorf("occ: VectorTable %s: writer %q's counter is at 2^64-1", t.Name, t.Writer)
	}
	next := base.Increment(t.Writer)
	// The stored vector is Before-or-Equal base when none of its counters
	// is above base's (a writer base lacks counts 0). jsonb numbers are
	// numeric, so counters up to 2^64-1 compare exactly.
	update := `UPDATE ` + n.table + ` SET ` + n.vec + ` = $3, ` + n.val + ` = $4
		WHERE ` + n.id + ` = $1 AND NOT EXISTS (
			SELECT 1 FROM jsonb_each_text(` + n.vec + `) AS s(w, c)
			WHERE s.c::numeric > COALESCE(($2::jsonb ->> s.w)::numeric, 0))
		RETURNING 1`
	// The row as it is now, to explain a refusal, and whether it already
	// holds this write.
	read := `SELECT ` + n.vec + `, ` + n.val + `, ` + n.val + ` IS NOT DISTINCT FROM $2
		FROM ` + n.table + ` WHERE ` + n.id + ` = $1`
	insert := `INSERT INTO ` + n.table + ` (` + n.id + `, ` + n.vec + `, ` + n.val + `) VALUES ($1, $2, $3)
		ON CONFLICT (` + n.id + `) DO NOTHING RETURNING 1`
	// Each round ends in success or a refusal unless the row changes
	// between two statements in a way writes through Write cannot make
	// (a vector that shrinks, a row deleted and re-created): a bound
	// keeps that from looping.
	const rounds = 4
	baseValue, err := base.Value()
	if err != nil {
		return Vector{}, fmt.Errorf("occ: VectorTable %s: base: %w", t.Name, err)
	}
	nextValue, err := next.Value()
	if err != nil {
		return Vector{}, fmt.Errorf("occ: VectorTable %s: next: %w", t.Name, err)
	}
	for range rounds {
		var one int
		sent := &sendCount{v: baseValue} // a repeat sent after a lost reply
		err := q.QueryRowContext(ctx, update, id, sent, next, value).Scan(&one)
		if err == nil {
			return next, nil
		}
		if n := sent.n.Load(); n > 1 && !oneConn(q) && !errors.Is(err, sql.ErrNoRows) {
			return Vector{}, sentAgain(ctx, fmt.Sprintf("vector write of %s id=%v", t.Name, id), n, err)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return Vector{}, dbErr(ctx, "vector write", err)
		}
		var stored Vector
		var storedValue []byte
		var sameValue bool
		err = q.QueryRowContext(ctx, read, id, value).Scan(&stored, &storedValue, &sameValue)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			sent := &sendCount{v: nextValue}
			err = q.QueryRowContext(ctx, insert, id, sent, value).Scan(&one)
			if err == nil {
				return next, nil
			}
			if n := sent.n.Load(); n > 1 && !oneConn(q) && !errors.Is(err, sql.ErrNoRows) {
				return Vector{}, sentAgain(ctx, fmt.Sprintf("vector insert of %s id=%v", t.Name, id), n, err)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return Vector{}, dbErr(ctx, "vector insert", err)
			}
			continue // another writer created the row first: judge against it
		case err != nil:
			return Vector{}, dbErr(ctx, "vector read", err)
		}
		order := stored.Compare(next)
		if order == Equal && sameValue {
			return next, nil // this write is already there
		}
		if base.descendsOrEqual(stored) {
			continue // the row moved back meanwhile: try again
		}
		return Vector{}, &VectorConflictError{
			Table: t.Name, ID: id, Writer: t.Writer,
			Base: base, Value: value,
			Stored: stored, StoredValue: storedValue,
			Order: order,
		}
	}
	return Vector{}, fmt.Errorf("%w: %s id=%v kept changing under %d tries of one write", ErrConflict, t.Name, id, rounds)
}
