// Package backstop is idemguard's PostgreSQL safety net: the row that
// makes an effect happen once even when Redis forgets a key.
//
// Redis can lose a record (a failover before replication, an eviction, a
// FLUSHALL) and a paused process can outlive its lease. Only the database
// that holds the business effect can make it atomic: Backstop.Commit
// inserts the key's row in the same transaction as the effect, and a key
// whose row exists was done before, so the caller rolls back and replays
// the stored result. Wrap puts the backstop under a guard on Redis: the
// store it returns consults PostgreSQL when Redis has forgotten a key, and
// gives every holder a fence the backstop checks at Commit. Backstop.Step
// and CommitStep do the same for a guard.Step whose effect is a write to
// the database. docs/design.md explains the fence rule and what the
// backstop catches that Redis cannot.
//
// The result a row keeps is opaque bytes: what Guard.Do and consumers
// replay, unchanged. An HTTP handler behind httpx.Guard commits its row
// with httpx.CommitResponse, which stores the response the client receives
// (status, header fields, body) in the middleware's versioned
// stored-response format, so a replay from PostgreSQL after Redis forgot
// the key is the original response. The httpx package documentation has
// the recipes for each outcome of the commit (committed,
// ErrAlreadyCommitted, ErrStaleFence, the backstop unreachable).
//
// The tables are package pgstore's: create them with pgstore.Migrate, and
// give backstop.New the same pgstore.Options. pgstore also holds a full
// guard.Store on PostgreSQL (which shares the keys table with the backstop),
// consumer deduplication, webhook deliveries and the purge of expired rows.
//
// The package imports database/sql and no driver: errors are classified
// through their SQLSTATE code (the SQLState method of lib/pq's *pq.Error
// and pgx's *pgconn.PgError) and database/sql's and the net package's
// errors, so a failure of either driver that means the database cannot be
// reached, or cannot take writes now (a hot standby: a primary demoted in
// a failover), wraps guard.ErrUnavailable.
//
// New returns an error for anything that can fail from its input: options
// that make no usable table names, and a nil *sql.DB (package guard's rule
// for constructors that return an error). Wrap, which returns no error,
// panics on a nil store or backstop, a programmer error of the kind
// http.Handle panics on.
package backstop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
	"github.com/idemguard/idemguard/pgstore"
)

// Backstop writes and reads the committed rows of idempotency keys. It is
// safe for concurrent use.
type Backstop struct {
	db   *sql.DB
	opts pgstore.Options
	t    pgsql.Tables
	q    backstopSQL
	sq   stepSQL // steps.go
}

// New returns a Backstop on db, in the tables opts names (create them with
// pgstore.Migrate, given the same Options). opts.TTL is how long a
// committed row is kept, and a holder's mark after its lease ends. New returns an error for
// a nil db and for options that make no usable table names.
func New(db *sql.DB, opts pgstore.Options) (*Backstop, error) {
	if db == nil {
		return nil, errors.New("backstop.New: nil *sql.DB")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.WithDefaults()
	t := pgsql.NewTables(opts.Schema, opts.TablePrefix)
	return &Backstop{db: db, opts: opts, t: t, q: newBackstopSQL(t), sq: newStepSQL(t)}, nil
}

// DB returns the database the backstop writes to.
func (b *Backstop) DB() *sql.DB { return b.db }

// Options returns the backstop's options with defaults filled in.
func (b *Backstop) Options() pgstore.Options { return b.opts }

type backstopSQL struct {
	commit, done, exhaust, extend, holder, lock, lookup, lookupFP, mark, peek, read, unmark string
}

func newBackstopSQL(t pgsql.Tables) backstopSQL {
	k := t.Keys
	return backstopSQL{
		// $1 scope, $2 id, $3 fingerprint, $4 token, $5 fence, $6 attempt, $7 recovered, $8 result, $9 ttl µs
		//
		// A new key is inserted. An existing row is taken over only when
		// it counts as absent (expired) or is a holder's uncommitted mark
		// that this commit may replace (same fingerprint; the caller's own
		// mark, still pending, or one with a lower fence). Otherwise
		// nothing is written: the caller's own row no longer pending was
		// failed over its head (its attempts ran out with its lease: the
		// key was answered Exhausted, which is final).
		commit: `INSERT INTO ` + k + ` AS k ` + keysColumns + `
			VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7, $8, '', NULL, ` + clockNow + `, ` + clockNow + ` + ` + dur("$9") + `)
			ON CONFLICT (scope, id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, status = 'completed',
				token = EXCLUDED.token, fence = EXCLUDED.fence, attempt = EXCLUDED.attempt,
				recovered = EXCLUDED.recovered, result = EXCLUDED.result, last_error = '', leased_until = NULL,
				steps = NULL, step_count = 0, expires_at = GREATEST(k.expires_at, EXCLUDED.expires_at)
			WHERE k.expires_at <= ` + clockNow + ` OR (k.status <> 'completed' AND k.fingerprint = EXCLUDED.fingerprint
				AND (k.fence < EXCLUDED.fence OR (k.fence = EXCLUDED.fence AND k.token = EXCLUDED.token AND k.status = 'pending')))`,
		// $1 scope, $2 id, $3 fingerprint as stored: the result of the
		// key's live committed row of that fingerprint (Func, after its
		// transaction failed).
		done: `SELECT result FROM ` + k + ` WHERE scope = $1 AND id = $2 AND fingerprint = $3
				AND status = 'completed' AND expires_at > ` + clockNow,
		// $1 scope, $2 id, $3 token, $4 lease µs, $5 ttl µs. The holder's
		// mark lives as long as its lease, and the TTL after it, also when
		// the new lease ends before the old one did (as the stores keep
		// a record: a dead holder's mark kept longer refused the key's
		// next payload after its store had forgotten the key). A lease
		// its holder's Fail or Release ended (unmark: leased_until NULL)
		// stays ended: an extension that reaches the row after it (given
		// up, but its statement queued behind a lock) does not revive it.
		extend: `UPDATE ` + k + ` SET leased_until = ` + clockNow + ` + ` + dur("$4") + `,
				expires_at = ` + clockNow + ` + ` + dur("$4") + ` + ` + dur("$5") + `
			WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND leased_until IS NOT NULL`,
		// $1 scope, $2 id: the token of the key's live row.
		holder: `SELECT token FROM ` + k + ` WHERE scope = $1 AND id = $2 AND expires_at > ` + clockNow,
		lock: `SELECT fingerprint, status, token, fence, result, expires_at <= ` + clockNow + `
			FROM ` + k + ` WHERE scope = $1 AND id = $2 FOR UPDATE`,
		lookup: `SELECT result, fence FROM ` + k + `
			WHERE scope = $1 AND id = $2 AND status = 'completed' AND expires_at > ` + clockNow,
		// $1 scope, $2 id, $3 fingerprint: lookup, and whether the row's
		// fingerprint is $3.
		lookupFP: `SELECT result, fingerprint = $3, fingerprint FROM ` + k + `
			WHERE scope = $1 AND id = $2 AND status = 'completed' AND expires_at > ` + clockNow,
		// $1 scope, $2 id. The committed row, or a holder's mark whose
		// lease is live; the last column: how long that lease has left
		// (µs, 0 for a committed row).
		peek: `SELECT status, fingerprint, token, fence, attempt, recovered, result,
				CASE WHEN status = 'completed' THEN 0 ELSE GREATEST(` + pgsql.UntilUS("leased_until") + `, 1) END
			FROM ` + k + ` WHERE scope = $1 AND id = $2 AND expires_at > ` + clockNow + `
				AND (status = 'completed' OR leased_until > ` + clockNow + `)`,
		// $1 scope, $2 id, $3 fingerprint, $4 token, $5 fence, $6 attempt, $7 recovered, $8 lease µs, $9 keep µs
		//
		// A key whose row expired starts afresh, without the steps
		// committed (Backstop.Step) before it expired: they were the
		// forgotten key's, and a step row outlives the mark of a holder
		// that committed it after its lease ran out. (One committed since,
		// by an unguarded attempt that wrote no row of its own, stays.)
		// Nor does it keep the steps a pgstore.Store on these tables kept
		// in the expired row (its steps column), as pgstore's own claim
		// of an expired row drops them.
		mark: `WITH forgotten AS (DELETE FROM ` + t.Steps + ` AS s USING ` + k + ` AS f
				WHERE s.scope = $1 AND s.id = $2 AND f.scope = $1 AND f.id = $2 AND f.expires_at <= ` + clockNow + `
					AND s.created_at <= f.expires_at)
			INSERT INTO ` + k + ` AS k ` + keysColumns + `
			VALUES ($1, $2, $3, 'pending', $4, $5, $6, $7, NULL, '', ` + clockNow + ` + ` + dur("$8") + `, ` + clockNow + `, ` + clockNow + ` + ` + dur("$9") + `)
			ON CONFLICT (scope, id) DO UPDATE SET
				fence = CASE WHEN k.token = EXCLUDED.token AND k.status = 'pending' AND k.expires_at > ` + clockNow + `
					THEN k.fence ELSE GREATEST(EXCLUDED.fence, k.fence + 1) END,
				fingerprint = EXCLUDED.fingerprint, status = 'pending', token = EXCLUDED.token,
				attempt = EXCLUDED.attempt, recovered = EXCLUDED.recovered, result = NULL, last_error = '',
				leased_until = EXCLUDED.leased_until,
				steps = CASE WHEN k.expires_at <= ` + clockNow + ` THEN NULL ELSE k.steps END,
				step_count = CASE WHEN k.expires_at <= ` + clockNow + ` THEN 0 ELSE k.step_count END,
				created_at = CASE WHEN k.expires_at <= ` + clockNow + ` THEN EXCLUDED.created_at ELSE k.created_at END,
				expires_at = CASE WHEN k.expires_at <= ` + clockNow + ` THEN EXCLUDED.expires_at
					ELSE GREATEST(k.expires_at, EXCLUDED.expires_at) END
			WHERE k.expires_at <= ` + clockNow + ` OR (k.status <> 'completed' AND k.fingerprint = EXCLUDED.fingerprint
				AND (k.token = EXCLUDED.token OR k.leased_until IS NULL OR k.leased_until <= ` + clockNow + `))
			RETURNING fence`,
		// The last column: how long another holder's lease has left
		// (µs, 0 when none is live).
		read: `SELECT fingerprint, status, result, fence,
				CASE WHEN token <> $3 AND leased_until > ` + clockNow + ` THEN GREATEST(` + pgsql.UntilUS("leased_until") + `, 1) ELSE 0 END
			FROM ` + k + ` WHERE scope = $1 AND id = $2 AND expires_at > ` + clockNow,
		// $1 scope, $2 id, $3 token, $4 forget. The holder's lease ends:
		// its mark no longer keeps other holders out. With forget (a
		// release), the mark of a first attempt counts as absent from now
		// on; its fence stays, so the next holder's is above it. Not when
		// a step of the key committed (Backstop.Step, CommitStep): its
		// effect happened, and the mark keeps refusing other payloads, as
		// the primary's failed record with the step does.
		// $1 scope, $2 id: the primary answered the key Exhausted (its
		// last attempt's lease ran out there): that holder's mark becomes
		// failed, so that its late commit is refused (commit). Whatever
		// the mark's own lease says: it was written after the primary's
		// claim, by the database's clock, so it can outlast the primary's
		// lease, and a commit it let through after this answer would be an
		// effect of a key given up. A commit under way holds the row: this
		// waits for it, and then finds it completed (Lookup's answer).
		exhaust: `UPDATE ` + k + ` SET status = 'failed', leased_until = NULL
			WHERE scope = $1 AND id = $2 AND status = 'pending' AND expires_at > ` + clockNow,
		unmark: `UPDATE ` + k + ` SET leased_until = NULL,
				expires_at = CASE WHEN $4 AND attempt <= 1 AND NOT EXISTS (SELECT 1 FROM ` + t.Steps + ` AS s
					WHERE s.scope = $1 AND s.id = $2 AND s.expires_at > ` + clockNow + `)
					THEN ` + clockNow + ` WHEN $5 THEN ` + clockNow + ` + ` + dur("$6") + ` ELSE expires_at END
			WHERE scope = $1 AND id = $2 AND token = $3 AND status = 'pending' AND expires_at > ` + clockNow,
	}
}

// checkLease refuses a lease no store hands out. Fence 0 is accepted: it
// is the unguarded lease of fallback's FailOpen (recorded nowhere), below
// every fence a store gives, so its commit takes only a key no holder is
// known for (no row, or an expired one) and is refused as stale beside
// any holder's row.
func checkLease(lease guard.Lease) error {
	if err := lease.Key.Validate(); err != nil {
		return err
	}
	if lease.Token == "" {
		return errors.New("backstop: lease without an owner token")
	}
	if lease.Fence < 0 {
		return fmt.Errorf("backstop: lease fence %d is negative", lease.Fence)
	}
	return nil
}

// Commit writes the key's row inside tx, the transaction that makes the
// business effect, and stores result in it: one INSERT … ON CONFLICT that
// inserts the row or, when the row is an uncommitted holder's mark the
// caller may replace, turns it into the committed row. When the
// transaction commits, the effect and the row exist together; when it
// rolls back, neither does.
//
// Inside a handler behind httpx.Guard, call httpx.CommitResponse instead:
// result must then be the response in the middleware's stored format, or
// the middleware cannot replay it from PostgreSQL.
//
// If the row shows the effect was committed before, Commit returns an
// *AlreadyCommittedError (ErrAlreadyCommitted) carrying the stored result
// and fence: roll tx back and answer with that result. If a later holder of
// the key is known to the backstop, it returns a *StaleFenceError
// (ErrStaleFence): roll back. A row written for another fingerprint gives
// an error matching guard.ErrMismatch, without the stored result.
//
// The fence rule: a row that is not committed (a holder's mark, written by
// the store Wrap returns, or the record of pgstore's Store while a holder
// has the key) records the fence of the
// latest holder. Commit succeeds on it only when the row is the caller's
// own (same token) or its fence is lower than the caller's. A holder
// whose lease was recovered by someone else therefore cannot commit once
// the recovering holder has claimed the key, even before that holder
// commits. An unguarded lease (fallback's FailOpen: fence 0, recorded
// nowhere) commits only where no row stands, or an expired one: the row
// keeps an effect run unguarded during an outage single, a duplicate
// gets ErrAlreadyCommitted, and any holder's row refuses it as stale.
//
// At READ COMMITTED (PostgreSQL's default) a transaction whose Commit
// waited for a concurrent commit of the key sees its row once the lock is
// granted (ErrAlreadyCommitted). At REPEATABLE READ or SERIALIZABLE that
// row is not in its snapshot: Commit answers guard.ErrUnavailable (a
// serialization failure, 40001), never success; roll back and run again,
// and the new transaction finds the row (Func reads it itself). At those
// levels the holder's own lease extension conflicts too: the guard
// extends a lease a third of the way through it, writing the key's row
// (under Wrap the holder's mark, on the Postgres Store its record), and a
// transaction whose first statement ran before that write cannot write
// the row: its Commit answers guard.ErrUnavailable, and so does every
// retry that runs as long. Keep such transactions shorter than a third of
// the lease (guard.Options.Lease), or run them at READ COMMITTED.
//
// Call Commit once per transaction: a second call in the same transaction
// finds the row the first one wrote, not yet committed, and answers
// ErrAlreadyCommitted with it.
//
// Call it last, just before tx commits: the key's row stays locked by tx
// until it ends, and under the store Wrap returns the holder's lease
// extensions write that row, so they wait for tx and fail. Work done in tx
// after Commit must end within the lease the holder has left: past it,
// the guard ends the holder's run (its context is cancelled), tx rolls
// back and nothing is committed, however often the key is retried.
// (CommitStep locks no row of the key: a step's transaction may last
// longer.)
func (b *Backstop) Commit(ctx context.Context, tx *sql.Tx, lease guard.Lease, fingerprint string, result []byte) error {
	if tx == nil {
		return errors.New("backstop: Commit needs the business transaction, got nil")
	}
	if err := checkLease(lease); err != nil {
		return err
	}
	if result == nil {
		result = []byte{}
	}
	fingerprint = pgstore.StoredText(fingerprint) // as the keys table keeps it: any bytes
	// An unguarded lease's row is stored with fence 1, the least a row
	// has: it is completed at once, and 1 replaces no holder's row (at
	// least 1, with another token), as 0 would not.
	args := []any{lease.Key.Scope, lease.Key.ID, fingerprint, lease.Token, max(lease.Fence, 1), lease.Attempt,
		lease.Recovered, result, b.opts.TTL.Microseconds()}
	for range 4 {
		res, err := tx.ExecContext(ctx, b.q.commit, args...)
		if err != nil {
			return dbErr(ctx, "commit", err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
		// The row stood in the way: see why, under its lock.
		var (
			fp, status, token string
			fence             int64
			stored            []byte
			expired           bool
		)
		err = tx.QueryRowContext(ctx, b.q.lock, lease.Key.Scope, lease.Key.ID).Scan(&fp, &status, &token, &fence, &stored, &expired)
		if errors.Is(err, sql.ErrNoRows) {
			continue // deleted meanwhile (purged or released): insert again
		}
		if err != nil {
			return dbErr(ctx, "commit", err)
		}
		switch {
		case expired:
			continue // expired meanwhile: it counts as absent now
		case fp != fingerprint:
			return fmt.Errorf("%w: %s was committed with another fingerprint", guard.ErrMismatch, lease.Key)
		case status == "completed":
			if stored == nil {
				stored = []byte{}
			}
			return &AlreadyCommittedError{Key: lease.Key, Result: stored, Fence: fence}
		case fence > lease.Fence || (fence == lease.Fence && token != lease.Token):
			return &StaleFenceError{Key: lease.Key, Fence: lease.Fence, Seen: fence}
		case fence == lease.Fence && status != "pending":
			// The holder's own row, failed over its head: its attempts
			// ran out with its lease (the key was answered Exhausted).
			return &StaleFenceError{Key: lease.Key, Fence: lease.Fence, Seen: fence}
		}
		// Changed between the two statements into a row we may replace.
	}
	return fmt.Errorf("backstop: commit %s: the row kept changing (is the transaction READ COMMITTED?)", lease.Key)
}

// Lookup reads the committed row of key: its stored result and the fence
// that committed it. found is false when no live committed row exists.
func (b *Backstop) Lookup(ctx context.Context, key guard.Key) (result []byte, fence int64, found bool, err error) {
	if err := key.Validate(); err != nil {
		return nil, 0, false, err
	}
	return committedRow(ctx, "lookup", b.db.QueryRowContext(ctx, b.q.lookup, key.Scope, key.ID))
}

// lookupAs reads the committed row of key as Lookup does, and whether it
// was committed with fingerprint (same: false means another payload's; a
// fingerprint column that does not decode is guard.ErrCorrupt).
func (b *Backstop) lookupAs(ctx context.Context, key guard.Key, fingerprint string) (result []byte, same, found bool, err error) {
	var stored string
	err = b.db.QueryRowContext(ctx, b.q.lookupFP, key.Scope, key.ID, pgstore.StoredText(fingerprint)).Scan(&result, &same, &stored)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, false, dbErr(ctx, "lookup", err)
	}
	if !same {
		if _, err := pgsql.ReadText(key, "fingerprint", stored); err != nil {
			return nil, false, false, err
		}
	}
	if result == nil {
		result = []byte{}
	}
	return result, same, true, nil
}

// committedRow reads a row of (result, fence), the query what's: found
// is false when there is none, and a found result is never nil.
func committedRow(ctx context.Context, what string, row *sql.Row) (result []byte, fence int64, found bool, err error) {
	err = row.Scan(&result, &fence)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, dbErr(ctx, what, err)
	}
	if result == nil {
		result = []byte{}
	}
	return result, fence, true, nil
}

// peek reads what the backstop knows of key for Wrap's Get: its
// committed row (a completed record), or a holder's mark whose lease is
// live (a pending record with the lease left, which keeps every other
// claim of the key out until then). found is false when there is neither.
func (b *Backstop) peek(ctx context.Context, key guard.Key) (rec guard.Record, found bool, err error) {
	var status string
	var leftUS int64
	rec.Key = key
	err = b.db.QueryRowContext(ctx, b.q.peek, key.Scope, key.ID).Scan(&status, &rec.Fingerprint, &rec.Token,
		&rec.Fence, &rec.Attempt, &rec.Recovered, &rec.Result, &leftUS)
	if errors.Is(err, sql.ErrNoRows) {
		return guard.Record{}, false, nil
	}
	if err != nil {
		return guard.Record{}, false, dbErr(ctx, "lookup", err)
	}
	// The fingerprint as the caller gave it, not as the row keeps it.
	if rec.Fingerprint, err = pgsql.ReadText(key, "fingerprint", rec.Fingerprint); err != nil {
		return guard.Record{}, false, err
	}
	if status == "completed" {
		if rec.Result == nil {
			rec.Result = []byte{}
		}
		return guard.Record{Key: key, State: guard.StateCompleted, Fingerprint: rec.Fingerprint, Fence: rec.Fence, Result: rec.Result}, true, nil
	}
	rec.State, rec.Result, rec.LeaseLeft = guard.StatePending, nil, pgsql.Micros(leftUS)
	return rec, true, nil
}

// TxFunc is a business effect made inside tx, the transaction the
// backstop commits the key's row in. It returns the result to store.
type TxFunc func(ctx context.Context, tx *sql.Tx, lease guard.Lease) ([]byte, error)

// Func returns a guard.Func that runs fn in a transaction on the backstop's
// database and commits the key's row in the same transaction. If the key
// was committed before, the transaction is rolled back and the stored
// result is returned as fn's, without error: the effect stays single.
// That holds when fn itself fails because the effect was made before (a
// unique business row the first commit wrote, a balance it spent), when
// the transaction lost a serialization failure or a deadlock to the one
// that committed the row (at REPEATABLE READ or SERIALIZABLE, where
// Commit answers guard.ErrUnavailable), and when the reply to its COMMIT
// was lost after it committed: a failed transaction is answered with the
// stored result when the key's committed row of this fingerprint exists
// once it rolled back. A stale fence is returned as an error and nothing
// is committed.
//
// The transaction lives in the context Guard.Do passes: when the lease is
// found lost, it is rolled back, and Func's error matches the context's
// cause (guard.ErrLeaseLost; guard.ErrMaxRun past Options.MaxRun).
//
// The transaction holds a connection of the backstop's pool while fn
// runs, and under the store Wrap returns each extension of the holder's
// lease writes its mark on another: a pool (sql.DB.SetMaxOpenConns) with
// no connection to spare while effects run ends every run that outlasts
// the lease it was claimed with, at the lease's deadline (its extensions
// wait for a connection and fail), each retry alike. Allow a connection per concurrent
// effect and some more, or give Wrap a Backstop on a pool of its own
// (over the same tables).
func (b *Backstop) Func(fingerprint string, fn TxFunc) guard.Func {
	return func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		return b.inTx(ctx, lease, fn, func(tx *sql.Tx, result []byte) error {
			return b.Commit(ctx, tx, lease, fingerprint, result)
		}, func(err error) error { return dbErr(ctx, "commit", err) }, func() ([]byte, bool) {
			var result []byte
			err := b.db.QueryRowContext(ctx, b.q.done, lease.Key.Scope, lease.Key.ID,
				pgstore.StoredText(fingerprint)).Scan(&result)
			return result, err == nil
		})
	}
}

// inTx runs fn in a transaction of its own and commit (the key's or a
// step's row) in the same transaction: when the row was committed before,
// fn's writes are rolled back and the committed result returned. A
// failure of the final COMMIT goes through commitErr.
//
// When the transaction fails (fn's error, commit's serialization failure
// or deadlock, the COMMIT's error), it is rolled back and committed reads
// the row on another connection: found, its result is the answer, as the
// effect was made (fn failed on what it made before, a concurrent
// transaction committed the row first and this one lost a serialization
// failure or a deadlock to it, or this COMMIT's reply was lost after it
// committed); else the error is.
//
// An error returned once ctx has ended carries ctx's cause too
// (guard.ErrLeaseLost, guard.ErrMaxRun when the guard ended the run), as
// guard.Do asks of its fn: not a bare context.Canceled, which reads as a
// caller gone away, nor a driver's "bad connection" for a statement the
// cancellation cut off.
func (b *Backstop) inTx(ctx context.Context, lease guard.Lease, fn TxFunc,
	commit func(tx *sql.Tx, result []byte) error, commitErr func(error) error,
	committed func() ([]byte, bool)) ([]byte, error) {
	result, err := b.inTx1(ctx, lease, fn, commit, commitErr, committed)
	// After ctx ended, the driver's error need not say so: lib/pq answers
	// "driver: bad connection" to a statement its cancellation cut off.
	if err != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); !errors.Is(err, cause) {
			err = fmt.Errorf("%w: %w", err, cause)
		}
	}
	return result, err
}

// inTx1 is inTx but for the context's cause.
func (b *Backstop) inTx1(ctx context.Context, lease guard.Lease, fn TxFunc,
	commit func(tx *sql.Tx, result []byte) error, commitErr func(error) error,
	committed func() ([]byte, bool)) ([]byte, error) {
	tx, err := pgsql.BeginTx(ctx, b.db, nil)
	if err != nil {
		return nil, dbErr(ctx, "begin", err)
	}
	defer func() { _ = tx.Rollback() }()
	result, err := fn(ctx, tx, lease)
	if err == nil {
		err = commit(tx, result)
		var done *AlreadyCommittedError
		if errors.As(err, &done) {
			return done.Result, nil // the deferred Rollback undoes fn's writes
		}
		if err != nil && !pgsql.LostRace(err) {
			return nil, err // refused (a stale fence, another fingerprint) or unreachable
		}
		if err == nil {
			if err = tx.Commit(); err == nil {
				return result, nil
			}
			err = commitErr(err)
		}
	}
	_ = tx.Rollback() // before the read: the transaction may hold the row's lock
	if stored, ok := committed(); ok {
		if stored == nil {
			stored = []byte{}
		}
		return stored, nil
	}
	return nil, err
}

// The statements the backstop makes on its own, outside the caller's
// transaction (a mark, its extension, its end, an exhaustion), run again
// after a lost race (pgsql.RetryLostRace): on a database whose default
// isolation is REPEATABLE READ or SERIALIZABLE, one that waited for a
// concurrent write of the key's row (the previous holder's Fail ending its
// mark, a live holder's keepalive extending it) fails so, having changed
// nothing, and the row as committed has the answer.

// unmark ends the lease of lease's holder on its mark, so the next holder
// need not wait for it (failed: by a Fail). A failure's mark is kept for the TTL from then, as
// the stores keep a failed record (kept to the old lease's end and the
// TTL after it, it refused another payload after the store had forgotten
// the key); a release's kept mark stays to the lease's end and the TTL
// after it, as the stores keep a released later attempt (KEEPTTL). With forget (a release), it also undoes the mark
// of a first attempt before any step of the key committed: the key is
// then as if it had never been claimed (a request with another payload
// may take it), as it is in the primary store.
func (b *Backstop) unmark(ctx context.Context, lease guard.Lease, forget, failed bool) error {
	err := pgsql.RetryLostRace(ctx, func() error {
		_, err := b.db.ExecContext(ctx, b.q.unmark, lease.Key.Scope, lease.Key.ID, lease.Token, forget, failed, b.opts.TTL.Microseconds())
		return err
	})
	return dbErr(ctx, "unmark", err)
}

// exhaust fails the mark of key's last holder once the primary answered a
// claim of key Exhausted: the holder, paused past its lease, can no longer
// commit after the key was given up (Wrap).
func (b *Backstop) exhaust(ctx context.Context, key guard.Key) error {
	err := pgsql.RetryLostRace(ctx, func() error {
		_, err := b.db.ExecContext(ctx, b.q.exhaust, key.Scope, key.ID)
		return err
	})
	return dbErr(ctx, "exhaust", err)
}

// extendMark keeps the mark of lease's holder for d from now and the
// backstop's TTL after that, as the holder's lease was just extended by d
// in the primary store: a mark must not expire while its holder may still
// commit. A row that bears another holder's token (one that took the key
// over once the holder's mark lapsed: a pgstore.Store on the same tables,
// say) answers guard.ErrLeaseLost; a row that is gone, or the holder's
// own no longer pending or with its lease ended by the holder's Fail or
// Release (unmark), is no error, and is not extended.
func (b *Backstop) extendMark(ctx context.Context, lease guard.Lease, d time.Duration) error {
	var res sql.Result
	err := pgsql.RetryLostRace(ctx, func() (err error) {
		res, err = b.db.ExecContext(ctx, b.q.extend, lease.Key.Scope, lease.Key.ID, lease.Token,
			d.Microseconds(), b.opts.TTL.Microseconds())
		return err
	})
	if err != nil {
		return dbErr(ctx, "extend mark", err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	var token string
	err = b.db.QueryRowContext(ctx, b.q.holder, lease.Key.Scope, lease.Key.ID).Scan(&token)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return dbErr(ctx, "extend mark", err)
	case token != lease.Token:
		return fmt.Errorf("%w: backstop: %s is held by another holder in PostgreSQL", guard.ErrLeaseLost, lease.Key)
	}
	return nil
}

// markResult is what the backstop knows of a key a primary store has just
// let a holder acquire.
type markResult struct {
	fence     int64  // the fence the holder must use (when neither flag is set)
	committed bool   // the effect was committed: replay result
	result    []byte // the committed result
	mismatch  bool   // the key was committed or claimed with another fingerprint
	// leaseLeft, when positive: another holder's lease on the key has
	// this long to run (the primary lost its record, or a pgstore.Store
	// on the same tables holds it), and the claim must wait.
	leaseLeft time.Duration
}

// mark records that the holder of lease took the key, so a holder with an
// older fence can no longer commit. The fence it returns is above every
// fence the backstop has seen for the key: after a primary that lost the
// key hands out fence 1 again, the holder still gets a fresh one. A key
// another holder's live lease keeps is not marked (leaseLeft).
func (b *Backstop) mark(ctx context.Context, req guard.ClaimRequest, lease guard.Lease) (markResult, error) {
	leaseUS := req.Lease.Microseconds()
	// The mark is kept for the lease and the TTL after it (extendMark
	// moves both), as the primary keeps a claimed record.
	keep := req.Lease + b.opts.TTL
	if keep < req.Lease {
		keep = math.MaxInt64
	}
	keepUS := keep.Microseconds()
	storedFP := pgstore.StoredText(req.Fingerprint) // as the keys table keeps it: any bytes
	// A lease of fence 0 (fallback's FailOpen, when Wrap is over a
	// fallback.Store) is marked with fence 1, the least a row has, as
	// Commit stores it: the keys table refuses fence 0, and every claim
	// of the outage failed on it, a paid key's too. Marked, the unguarded
	// lease is guarded by PostgreSQL: its duplicates are told InProgress.
	markFence := max(lease.Fence, 1)
	for range 4 {
		var fence int64
		err := pgsql.RetryLostRace(ctx, func() error {
			return b.db.QueryRowContext(ctx, b.q.mark, req.Key.Scope, req.Key.ID, storedFP, lease.Token,
				markFence, lease.Attempt, lease.Recovered, leaseUS, keepUS).Scan(&fence)
		})
		if err == nil {
			return markResult{fence: fence}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return markResult{}, dbErr(ctx, "mark", err)
		}
		// Not updated: committed, or another fingerprint's row.
		var fp, status string
		var result []byte
		var leftUS int64
		err = b.db.QueryRowContext(ctx, b.q.read, req.Key.Scope, req.Key.ID, lease.Token).Scan(&fp, &status, &result, &fence, &leftUS)
		if errors.Is(err, sql.ErrNoRows) {
			continue // expired or deleted meanwhile: mark again
		}
		if err != nil {
			return markResult{}, dbErr(ctx, "mark", err)
		}
		if fp != storedFP {
			if _, err := pgsql.ReadText(req.Key, "fingerprint", fp); err != nil {
				return markResult{}, err // unreadable: no answer, not a mismatch
			}
			return markResult{mismatch: true}, nil
		}
		if status == "completed" {
			if result == nil {
				result = []byte{}
			}
			return markResult{committed: true, result: result, fence: fence}, nil
		}
		if leftUS > 0 {
			return markResult{leaseLeft: pgsql.Micros(leftUS)}, nil
		}
		// Changed between the two statements: try again.
	}
	return markResult{}, fmt.Errorf("%w: mark %s: the row kept changing", guard.ErrUnavailable, req.Key)
}
