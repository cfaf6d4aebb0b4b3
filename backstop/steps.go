package backstop

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql"
)

// Steps in PostgreSQL.
//
// guard.Step stores a step's result with the key's record in the guard's
// store; a store that forgets the key (Redis after a failover, a FLUSHALL,
// an eviction) forgets its steps too, and the next attempt runs them
// again. A step whose effect is a write to this database commits a row of
// its own in the same transaction (Backstop.CommitStep, or Backstop.Step
// which does it all): one row per key and step name, so the effect is
// committed once whatever the guard's store remembers. A step that runs
// again after the store forgot it makes its writes again in a new
// transaction, finds the row, rolls back, and returns the committed
// result.

type stepSQL struct {
	insert, read, fence string
}

func newStepSQL(t pgsql.Tables) stepSQL {
	return stepSQL{
		// $1 scope, $2 id, $3 name, $4 result, $5 fence, $6 token, $7 ttl µs
		insert: `INSERT INTO ` + t.Steps + ` AS s (scope, id, name, result, fence, token, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, ` + clockNow + `, ` + clockNow + ` + ` + dur("$7") + `)
			ON CONFLICT (scope, id, name) DO UPDATE SET result = EXCLUDED.result, fence = EXCLUDED.fence,
				token = EXCLUDED.token, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
			WHERE s.expires_at <= ` + clockNow + `
			RETURNING 1`,
		read: `SELECT result, fence FROM ` + t.Steps + ` WHERE scope = $1 AND id = $2 AND name = $3`,
		// The key's live row: a holder's mark (Wrap), a pgstore.Store
		// record, or the row a holder committed (a completed row refuses
		// every step but its own holder's, as a later holder's mark does).
		fence: `SELECT fence, token, status FROM ` + t.Keys + `
			WHERE scope = $1 AND id = $2 AND expires_at > ` + clockNow,
	}
}

// CommitStep writes the row of the step name of lease's key inside tx, the
// transaction that makes the step's effect, with result: when tx commits,
// the effect and the row exist together; when it rolls back, neither
// does. The row is kept for Options.TTL.
//
// If the step was committed before (by this key's earlier attempt, whose
// result the guard's store lost or never stored), CommitStep returns an
// *AlreadyCommittedError (ErrAlreadyCommitted) with the stored result and
// fence: roll tx back and use that result. If a later holder of the key is
// known to the backstop (a mark written by the store Wrap returns, the
// Postgres Store's record, or the row its Commit wrote, with a higher fence
// or the same fence and another token; an unguarded lease's fence is below
// every holder's), or the key was given up (answered Exhausted: the
// holder's own row failed), it returns a *StaleFenceError: roll back. That
// check reads the key's row without locking it; the step's row is what
// makes its effect happen once.
//
// The step's row belongs to the key's current life only if tx commits
// before that life's row expires (its retention passed, the lease long
// over): a transaction still open then can commit the step after a
// claim or Purge started the key afresh (they do not see an uncommitted
// row), and the key's next life finds it (ErrAlreadyCommitted). Backstop.Step
// ends its transaction with the lease; a tx of your own should end with
// it too.
//
// Inside guard.Step, Backstop.Step does all of this. At REPEATABLE READ
// or SERIALIZABLE, a CommitStep that waited for a concurrent commit of the
// step answers guard.ErrUnavailable (a serialization failure), as Commit
// does: roll back and run again.
func (b *Backstop) CommitStep(ctx context.Context, tx *sql.Tx, lease guard.Lease, name string, result []byte) error {
	if tx == nil {
		return errors.New("backstop: CommitStep needs the business transaction, got nil")
	}
	if err := checkLease(lease); err != nil {
		return err
	}
	if err := guard.CheckStep(0, name); err != nil {
		return err
	}
	if result == nil {
		result = []byte{}
	}
	q := b.sq
	sc, id := lease.Key.Scope, lease.Key.ID
	var one int
	// An unguarded lease's step row has fence 1, the least a row has (see
	// Commit); the check below still compares the lease's own fence.
	err := tx.QueryRowContext(ctx, q.insert, sc, id, name, result, max(lease.Fence, 1), lease.Token, b.opts.TTL.Microseconds()).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		// The step's row exists: its effect was committed.
		var stored []byte
		var fence int64
		if err := tx.QueryRowContext(ctx, q.read, sc, id, name).Scan(&stored, &fence); err != nil {
			return dbErr(ctx, "commit step", err)
		}
		if stored == nil {
			stored = []byte{}
		}
		return &AlreadyCommittedError{Key: lease.Key, Result: stored, Fence: fence}
	}
	if err != nil {
		return dbErr(ctx, "commit step", err)
	}
	var fence int64
	var token, status string
	err = tx.QueryRowContext(ctx, q.fence, sc, id).Scan(&fence, &token, &status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return dbErr(ctx, "commit step", err)
	case fence > max(lease.Fence, 1) || (fence == max(lease.Fence, 1) && token != lease.Token):
		// (An unguarded lease's own row, its Commit's, has fence 1.)
		return &StaleFenceError{Key: lease.Key, Fence: lease.Fence, Seen: fence}
	case fence == max(lease.Fence, 1) && status == "failed":
		// The holder's own row was failed over its head: the key was
		// answered Exhausted (its lease ran out at its last attempt), as
		// Commit refuses. (Its own completed row is no later holder's.)
		return &StaleFenceError{Key: lease.Key, Fence: lease.Fence, Seen: fence}
	}
	return nil
}

// Step runs fn as the guard step name of lease (guard.Step) inside a
// transaction on the backstop's database, and commits the step's row in
// it (CommitStep): the step's effect is committed once even when the
// guard's store forgot the key. It returns the step's result: fn's, or
// the one committed before (the transaction then rolls back, undoing fn's
// writes), also when fn fails because the step's effect was made before (a
// unique row of it stands), when the transaction lost a serialization
// failure or a deadlock to the one that committed the step, and when the
// reply to its COMMIT was lost after it committed: a failed transaction is
// answered with the step's committed row when one exists once it rolled
// back. A stale fence is returned as an error and nothing is committed. The
// result is stored with the key's record too, as every step's is: a later
// attempt gets it from its claim without running fn or touching the
// database.
//
// Put only the transaction's work in fn: a call to another service inside
// it could happen again when the step runs again after the guard's store
// forgot the key (pass that call guard.Lease.KeyFor instead, in a step of
// its own).
func (b *Backstop) Step(ctx context.Context, lease guard.Lease, name string, fn TxFunc) ([]byte, error) {
	return guard.Step(ctx, lease, name, func(ctx context.Context) ([]byte, error) {
		result, err := b.inTx(ctx, lease, fn, func(tx *sql.Tx, result []byte) error {
			return b.CommitStep(ctx, tx, lease, name, result)
		}, func(err error) error {
			// A connection lost at COMMIT (outcome unknown) is
			// ErrUnavailable; a COMMIT refused (a deferred constraint)
			// rolled back for good, a plain error.
			return dbErr(ctx, fmt.Sprintf("commit of step %q", name), err)
		}, func() ([]byte, bool) {
			stored, _, found, err := b.LookupStep(ctx, lease.Key, name)
			return stored, found && err == nil
		})
		if err != nil {
			return nil, err
		}
		if result == nil {
			result = []byte{}
		}
		return result, nil
	})
}

// LookupStep reads the committed row of the step name of key: its result
// and the fence that committed it. found is false when no live row exists.
func (b *Backstop) LookupStep(ctx context.Context, key guard.Key, name string) (result []byte, fence int64, found bool, err error) {
	if err := key.Validate(); err != nil {
		return nil, 0, false, err
	}
	return committedRow(ctx, "lookup step", b.db.QueryRowContext(ctx, `SELECT result, fence FROM `+b.t.Steps+`
		WHERE scope = $1 AND id = $2 AND name = $3 AND expires_at > `+clockNow, key.Scope, key.ID, name))
}
