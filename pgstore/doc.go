// Package pgstore keeps idemguard's records in PostgreSQL, through
// database/sql with any driver (lib/pq, pgx's stdlib): its tables and their
// migrations, a full guard.Store, and the helpers that share those tables.
//
//   - Migrate, MigrateDown and Migrator: the embedded, numbered migrations
//     (NNNN_name.up.sql / .down.sql), each applied in its own transaction
//     under an advisory lock and recorded in the schema-version table. They
//     create every table idemguard uses on PostgreSQL, the ones package
//     backstop writes included: run them once, whichever package you use.
//   - Store (New): a guard.Store and guard.StepStore on PostgreSQL, for
//     deployments without Redis and as fallback's secondary store.
//   - Store.MarkConsumed and Store.Consume: consumer deduplication inside the
//     handler's own transaction.
//   - Store.InsertOrRetry, MarkDelivered, MarkDeliveryFailed: webhook
//     deliveries, one pending row per (event, ref).
//   - Store.Purge: batched deletion of expired rows.
//
// Package backstop writes the same keys table from inside the caller's
// business transaction; optimistic concurrency (versioned updates) is
// package occ. docs/design.md describes the tables and the guarantees.
//
// Errors of the database are classified through their SQLSTATE code (the
// SQLState method lib/pq's and pgx's errors both have) and through
// database/sql's and the net package's errors: a connection that failed, a
// server shutting down or out of resources, a serialization failure or a
// deadlock, a server timeout, and a write refused by a read-only
// transaction or a transaction a server in recovery refuses to begin (a
// hot standby, as a primary demoted in a failover is) wrap
// guard.ErrUnavailable. On such a database a claim of a completed key is
// still answered with its replay, read (Store.Claim).
//
// Size the *sql.DB's pool for the calls you make at once: database/sql
// keeps 2 idle connections unless told otherwise (DB.SetMaxIdleConns), so
// with more calls at once most statements open a connection of their own,
// a PostgreSQL backend started and stopped per statement. The contract
// suite's DoBatch race over this Store (8 goroutines, 1,536 claims and
// their completions) took 25 s so, and 2.3 s with SetMaxIdleConns(32) and
// SetMaxOpenConns(32). The same holds for package backstop's *sql.DB.
//
// Constructors (New, NewMigrator) return an error for anything that can
// fail from input: options that make no usable table names, and a nil
// *sql.DB (package guard's rule for constructors that return an error).
// Table and schema names are quoted identifiers; values are always bound
// parameters.
package pgstore
