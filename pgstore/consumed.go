package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/internal/pgsql"
)

// MarkConsumed records, inside tx, that group consumed messageID. It
// returns true the first time; false means the message was consumed
// before (by a committed transaction): roll tx back and acknowledge the
// message without handling it. A concurrent duplicate waits until the
// first transaction ends. The row is kept for Options.TTL; after that the
// message counts as new again.
//
// Unlike a deduplicator that marks a message before its handler runs, the
// mark lives in the handler's transaction: a handler that fails rolls the
// mark back with its work, and the redelivered message runs again.
//
// group and messageID may be any bytes (a raw message key): they are kept
// as StoredText keeps them, in a unique index whose entries PostgreSQL
// limits to 2704 bytes after compression. A pair too long for it (about
// 2.6 kB of text that does not compress, 2 kB of random bytes) is refused
// with the server's error (SQLSTATE 54000, program_limit_exceeded: no
// retry makes it fit); pass a digest of a longer message id.
func (s *Store) MarkConsumed(ctx context.Context, tx *sql.Tx, group, messageID string) (first bool, err error) {
	if tx == nil {
		return false, errors.New("pgstore: MarkConsumed needs the handler's transaction, got nil")
	}
	if group == "" || messageID == "" {
		return false, fmt.Errorf("pgstore: consumer group %q and message id %q must not be empty", group, messageID)
	}
	res, err := tx.ExecContext(ctx, `INSERT INTO `+s.t.Consumed+` AS c (consumer_group, message_id, expires_at)
		VALUES ($1, $2, `+clockNow+` + `+dur("$3")+`)
		ON CONFLICT (consumer_group, message_id) DO UPDATE
		SET consumed_at = now(), expires_at = EXCLUDED.expires_at
		WHERE c.expires_at <= `+clockNow, StoredText(group), StoredText(messageID), s.opts.TTL.Microseconds())
	if err != nil {
		return false, dbErr(ctx, "mark consumed", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, dbErr(ctx, "mark consumed", err)
	}
	return n == 1, nil
}

// Consume runs fn once per (group, messageID): in one transaction it marks
// the message consumed and runs fn, and commits both or neither. A
// duplicate returns ran == false without calling fn. If fn fails, nothing
// is kept and its error is returned, so the message can be delivered again.
//
// The transaction has the database's default isolation. Under REPEATABLE
// READ or SERIALIZABLE, a duplicate that waited for the first delivery's
// transaction meets a serialization failure on its mark (the first's row
// is not in its snapshot); Consume then begins again, before fn runs, and
// answers ran == false as under READ COMMITTED.
func (s *Store) Consume(ctx context.Context, group, messageID string, fn func(ctx context.Context, tx *sql.Tx) error) (ran bool, err error) {
	const tries = 4
	for try := 1; ; try++ {
		ran, retry, err := s.consume(ctx, group, messageID, fn)
		if !retry || try == tries {
			return ran, err
		}
	}
}

// consume is one try of Consume; retry is true when the mark met a
// serialization failure or deadlock, before fn ran.
func (s *Store) consume(ctx context.Context, group, messageID string, fn func(ctx context.Context, tx *sql.Tx) error) (ran, retry bool, err error) {
	tx, err := pgsql.BeginTx(ctx, s.db, nil)
	if err != nil {
		return false, false, dbErr(ctx, "begin", err)
	}
	defer func() { _ = tx.Rollback() }()
	first, err := s.MarkConsumed(ctx, tx, group, messageID)
	if err != nil {
		return false, pgsql.LostRace(err) && ctx.Err() == nil, err
	}
	if !first {
		return false, false, nil
	}
	if err := fn(ctx, tx); err != nil {
		return false, false, err
	}
	if err := tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) && ctx.Err() != nil {
			// database/sql rolled the transaction back as ctx ended:
			// nothing was kept, and the cancellation is the reason.
			return false, false, fmt.Errorf("pgstore: consume: %w", context.Cause(ctx))
		}
		return false, false, dbErr(ctx, "commit", err)
	}
	return true, false, nil
}
