package redisstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// An entry can be dead-lettered on two paths: by consumerx, when the
// consumer that ran its last attempt finds it failed (its attempts ran
// out), and by the consumer that finds it deleted from the stream with its
// record failed (ErrDeleted, see deleted). When the entry is deleted
// while its last attempt runs, both find the record failed. consumerx's
// dead-letter record is named by the entry's fingerprint, which the
// deleted path cannot know (the payload is gone, and a RedisStore keeps a
// long fingerprint as a digest only), so both paths send under a record of
// their own named by the entry id alone: the dead letter goes out once,
// whichever path sends it first (docs/design.md, the trimmed-stream row).

// entryDeadCall: claims of an entry's dead-letter record have no attempt
// limit, as consumerx's.
var entryDeadCall = guard.CallOptions{MaxAttempts: -1}

// entryDeadKey returns the record an entry's dead letter is sent under
// (see above): scope consumerx.DeadLetterScopePrefix + group, id "entry:"
// and the hex SHA-256 of the entry's Message.ID (consumerx's own records
// there are named by bare hex digests). The entry id names it whatever
// Options.Process.Key says (with Key set the deleted path cannot find the
// message's own record and dead-letters at once, but under this one: its
// dead letter still goes out once). ok is false for a message that is
// not an entry.
func (c *Consumer) entryDeadKey(msg consumerx.Message) (key guard.Key, ok bool) {
	xm, isEntry := msg.Raw.(redis.XMessage)
	if !isEntry || xm.ID == "" {
		return guard.Key{}, false
	}
	sum := sha256.Sum256([]byte(ID(c.opts.Stream, xm.ID)))
	return guard.Key{Scope: consumerx.DeadLetterScopePrefix + c.opts.Group, ID: "entry:" + hex.EncodeToString(sum[:])}, true
}

// entryLease is the context key of the lease of the entry's dead-letter
// record that sendOnce runs send under.
type entryLease struct{}

// sendOnce runs send, which sends msg's dead letter, under the entry's
// dead-letter record (entryDeadKey), so that it runs at most once to
// success, whichever path calls it. sent is false, with a nil error, when
// the dead letter was sent already; an error matching guard.ErrInProgress
// means another consumer is sending it now. Without the record, it just
// runs send.
func (c *Consumer) sendOnce(ctx context.Context, msg consumerx.Message, send func(context.Context) error) (sent bool, err error) {
	key, ok := c.entryDeadKey(msg)
	if !ok {
		return true, send(ctx)
	}
	ran := false
	res, err := c.g.DoWith(ctx, key, "", func(lctx context.Context, l guard.Lease) ([]byte, error) {
		// send records its steps (deadLetterOnce's xadd) under this
		// record, which both paths claim, not under consumerx's own
		// dead-letter record, which the deleted path cannot: a retry on
		// either path then finds the entry added.
		err := send(context.WithValue(lctx, entryLease{}, l))
		ran = err == nil
		return nil, err
	}, entryDeadCall)
	if err != nil && ran && errors.Is(err, guard.ErrUnavailable) && !errors.Is(err, guard.ErrLeaseLost) {
		// Sent, but the record's completion was refused (a lost reply, a
		// failover): tried again, as consumerx tries its own, so that the
		// next delivery does not send it again.
		err = consumerx.Recomplete(ctx, c.g, res, err)
	}
	if err != nil {
		return false, fmt.Errorf("redisstream: dead letter of %s: %w", msg.ID, err)
	}
	return !res.Replayed, nil
}

// sendOnceAfter is sendOnce for consumerx's dead letter (the consumer that
// ran the entry's last attempt): when another consumer is sending it now
// (it found the entry deleted), it waits until that send has settled, then
// sends it unless that one was sent. Redis has dropped a deleted entry
// from the pending list: were the other send to fail with this one given
// up (InProgress, left for a redelivery that never comes), nothing would
// dead-letter the entry. The wait ends with ctx (the dead-letter record's
// lease, or the consumer's shutdown).
func (c *Consumer) sendOnceAfter(ctx context.Context, msg consumerx.Message, send func(context.Context) error) (sent bool, err error) {
	key, ok := c.entryDeadKey(msg)
	for {
		sent, err = c.sendOnce(ctx, msg, send)
		// Only the claim of its record answered in progress, not send
		// (an error of its own matching guard.ErrInProgress): send has
		// not run.
		busy, isBusy := errors.AsType[*guard.InProgressError](err)
		if !ok || !isBusy || busy.Key != key {
			return sent, err
		}
		out, werr := c.g.Wait(ctx, key, "", guard.WaitOptions{Timeout: -1, CallOptions: entryDeadCall})
		if werr != nil {
			return false, fmt.Errorf("redisstream: dead letter of %s, sent by another consumer: %w", msg.ID, werr)
		}
		if out.Status == guard.Replay {
			return false, nil
		}
		// Its sender failed (or let its lease run out): send it here, under
		// sendOnce's own call (it keeps the lease alive).
		if rerr := c.g.Release(ctx, out.Lease); rerr != nil {
			return false, fmt.Errorf("redisstream: dead letter of %s: %w", msg.ID, rerr)
		}
	}
}
