// Package occ is optimistic concurrency control on PostgreSQL, through
// database/sql with any driver (lib/pq, pgx's stdlib): a write names the
// version it was based on and applies only if the row is still there, in
// one statement, so a lost update becomes an error the caller handles.
//
// Two kinds of version:
//
//   - A single integer version (VersionedTable): every update bumps it, and
//     one based on an older version is refused with ErrConflict; the writer
//     re-reads and tries again (RetryOnConflict, UpdateRetry). Use it when
//     the row is the only place the entity changes and a writer can redo its
//     change on the newer state (add 10, set a field).
//   - A version vector (Vector, VectorTable): a counter per writer, so two
//     versions can be compared wherever they were made: one descends from
//     the other, or they are concurrent. A write that saw everything stored
//     goes through; one concurrent with the stored version is refused with a
//     *VectorConflictError carrying both, and the application merges the two
//     values as siblings, in the manner of Dynamo (DeCandia et al., SOSP
//     2007), and writes the merge. Use it when versions of the entity are
//     also made or kept outside this row (regions with their own replica or
//     cache, offline clients, changes queued and applied later), or when a
//     change cannot simply be redone on the newer state and must be merged.
//
// occ ships no tables: the application adds a version column
// (VersionedTable.Migration) or a jsonb vector column
// (VectorTable.Migration) to its own table, with its own migration tool.
// The vector's column form is jsonb, one column read and written through
// Vector's sql.Scanner and driver.Valuer, compared inside the UPDATE.
//
// Errors: sentinels for branching (ErrConflict, ErrConcurrent, ErrNotFound,
// ErrUnavailable) with errors.Is; *VectorConflictError for the data, with
// errors.As. PostgreSQL errors are classified by SQLSTATE, whichever driver
// reported them.
package occ
