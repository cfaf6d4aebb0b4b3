package pgstore

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// releasedKeep is how long Purge keeps the row of a released first
// attempt after its release, as the Redis store keeps its released
// marker (release.lua) and memstore its tomb: a claim in that time gets a
// larger fence than the released holder's.
const releasedKeep = time.Minute

// DefaultPurgeBatch is how many rows one purge statement deletes by default.
const DefaultPurgeBatch = 1000

// PurgeOptions shape Purge. The zero value is ready to use.
type PurgeOptions struct {
	// BatchSize is the most rows one DELETE removes; each batch is its own
	// short transaction, so a purge never holds many locks or bloats one
	// transaction. Default DefaultPurgeBatch.
	BatchSize int
	// Before keeps rows that expired less than this long ago: only rows
	// with expires_at <= now() - Before are deleted. Zero deletes every
	// expired row; a negative value is refused.
	Before time.Duration
	// Progress, if set, is called after every batch with the table's name
	// and the rows deleted from it so far.
	Progress func(table string, deleted int64)
}

// Purge deletes the expired rows (expired at least opts.Before ago) of the
// keys, consumed-messages and steps tables, and the steps of the keys it
// deletes, in batches, until none is left, and returns how many it deleted.
// Live rows are never touched, but for the steps of a key it deletes
// (that key starts afresh when claimed again), and neither is the row of
// a released first attempt for a minute after its release, whatever
// Before (it keeps the fence, as the Redis store's released marker does:
// a claim in that time takes the next one, and a write of the released
// holder still on its way downstream is refused by a fence check). It stops early, returning the count so far,
// when ctx ends. Rows locked by a running transaction are skipped and left
// for the next purge, and so is a key whose steps were not all deleted
// with it (it expired while the purge ran, or one of its step rows was
// locked): a key's row never goes before its committed steps (a step a
// transaction commits after the key's row expired is not seen: see
// backstop.Backstop.CommitStep). On a database whose default isolation is stricter
// than READ COMMITTED, a batch refused with a serialization failure (it
// met a row changed since it began) is run again, as the Store's
// statements are.
func (s *Store) Purge(ctx context.Context, opts PurgeOptions) (int64, error) {
	if opts.BatchSize < 0 {
		return 0, fmt.Errorf("pgstore: purge batch size %d is negative", opts.BatchSize)
	}
	if opts.Before < 0 {
		return 0, fmt.Errorf("pgstore: purge before %s is negative", opts.Before)
	}
	if opts.BatchSize == 0 {
		opts.BatchSize = DefaultPurgeBatch
	}
	var total int64
	byTable := map[string]int64{}
	expired := `expires_at <= now() - $2 * interval '1 microsecond'`
	// A released first attempt's row (pending without a lease: the
	// Store's Release, or backstop's unmark of a first attempt) reads as
	// absent from its release on, but its holder ran and a write of its
	// may still be on its way downstream: the row keeps the fence for
	// releasedKeep, as the Redis store's released marker does, so that a
	// claim in that time takes a larger one, whatever Before says.
	keyExpired := func(k string) string {
		return k + expired + ` AND NOT (` + k + `status = 'pending' AND ` + k + `leased_until IS NULL AND ` +
			k + `expires_at > now() - ` + strconv.FormatInt(releasedKeep.Microseconds(), 10) + ` * interval '1 microsecond')`
	}
	for _, p := range []struct{ name, table, key, where string }{
		// First the steps of the keys about to be deleted, committed
		// before their key expired, live or not: a key claimed again once
		// its row is gone starts afresh, and must not find the forgotten
		// key's steps.
		{"steps", s.t.Steps, "scope, id, name", `EXISTS (SELECT 1 FROM ` + s.t.Keys + ` AS k
			WHERE k.scope = s.scope AND k.id = s.id AND ` + keyExpired("k.") + ` AND s.created_at <= k.expires_at)`},
		// A key whose steps the pass above left (it expired since that
		// pass began, or a step row was locked) is kept for the next
		// purge: deleted now, its steps would outlive it and be found by
		// the key's next life.
		{"keys", s.t.Keys, "scope, id", keyExpired("s.") + ` AND NOT EXISTS (SELECT 1 FROM ` + s.t.Steps + ` AS st
			WHERE st.scope = s.scope AND st.id = s.id AND st.created_at <= s.expires_at)`},
		{"consumed_messages", s.t.Consumed, "consumer_group, message_id", expired},
		{"steps", s.t.Steps, "scope, id, name", expired},
	} {
		q := `DELETE FROM ` + p.table + ` WHERE (` + p.key + `) IN (
			SELECT ` + p.key + ` FROM ` + p.table + ` AS s WHERE ` + p.where + `
			LIMIT $1 FOR UPDATE SKIP LOCKED)`
		deleted := byTable[p.name] // the steps are purged in two passes
		for {
			if err := ctx.Err(); err != nil {
				return total, err
			}
			// Run again after a serialization failure, as the Store's
			// statements are: on a database whose default isolation is
			// REPEATABLE READ, a batch meeting an expired row changed since
			// its statement began fails so, having changed nothing.
			res, err := s.exec(ctx, q, opts.BatchSize, opts.Before.Microseconds())
			if err != nil {
				return total, dbErr(ctx, "purge "+p.name, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return total, dbErr(ctx, "purge "+p.name, err)
			}
			deleted += n
			total += n
			if opts.Progress != nil && n > 0 {
				opts.Progress(p.name, deleted)
			}
			if n < int64(opts.BatchSize) {
				break
			}
		}
		byTable[p.name] = deleted
	}
	return total, nil
}
