package redisstream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// ErrDeleted is the cause an entry is dead-lettered with when it was
// deleted from the stream (XDEL, XTRIM, MAXLEN) while pending and its
// record shows its effect did not complete and will not: none (released
// or expired), failed, or pending with its lease run out and nobody
// holding it (the consumer then records its holder's attempt failed
// first, so that a holder running past its lease cannot complete it after
// the dead letter); in each case still so MinIdle after it was found
// deleted, for a consumer that has just read it (its claim on the way)
// may yet claim it, a failed record as a new one, and run it (a failed
// record whose attempts ran out is dead-lettered at once: no claim takes
// it). Its fields are gone, so it cannot run again after that. One still running elsewhere (its holder's lease
// alive) is watched until its record settles, not dead-lettered while it
// runs (see Consumer.Run). Two cases
// are dead-lettered without that knowledge, and say so in the cause: with
// Options.Process.Key set (the key is in the fields that are gone: the
// record is "unknown"), and past maxWatched (1024) entries watched at once
// (the record shows "pending … lease left": check it before adding the
// payload again). The dead letter carries its id alone;
// Options.Process's OnOutcome does not hear of it (nothing was
// delivered). It is sent under the entry's own dead-letter record, as the
// consumer that runs the entry's last attempt sends its own (its attempts
// ran out): an entry deleted while its last attempt fails is dead-lettered
// once, by whichever comes first.
var ErrDeleted = errors.New("redisstream: entry deleted from the stream while pending")

// gonePendingScript returns the ids of the group ARGV[1]'s pending
// entries of stream KEYS[1], from ARGV[2] on, ARGV[3] at most, that are
// no longer in the stream: those the next XAUTOCLAIM from ARGV[2] names
// deleted (it names them whatever their idle time, and looks at up to ten
// times its COUNT). It only reads, so a copy sent again answers the same.
var gonePendingScript = redis.NewScript(`
local gone = {}
for _, e in ipairs(redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], '+', ARGV[3])) do
  if #redis.call('XRANGE', KEYS[1], e[1], e[1]) == 0 then gone[#gone + 1] = e[1] end
end
return gone
`)

// gonePending runs gonePendingScript for the XAUTOCLAIM autoClaim is to
// send from cursor.
func (c *Consumer) gonePending(ctx context.Context, cursor string) ([]string, error) {
	return gonePendingScript.Run(ctx, c.client, []string{c.opts.Stream},
		c.opts.Group, cursor, 10*c.opts.Count).StringSlice()
}

// minIdleMillis is MinIdle in whole milliseconds, at least 1 (as go-redis
// sends a positive duration under 1ms).
func (c *Consumer) minIdleMillis() int64 { return max(c.opts.MinIdle.Milliseconds(), 1) }

// autoClaim sends XAUTOCLAIM and returns where the pass goes on, the
// entries it handed over, and the ids of pending entries no longer in the
// stream: Redis 7 drops those from the pending list itself and names them
// apart (go-redis's XAutoClaim discards them), Redis 6.2 hands them over
// without fields.
func (c *Consumer) autoClaim(ctx context.Context, cursor string) (next string, msgs []redis.XMessage, deleted []string, err error) {
	cmd := redis.NewSliceCmd(ctx, "xautoclaim", c.opts.Stream, c.opts.Group, c.opts.Consumer,
		c.minIdleMillis(), cursor, "count", c.opts.Count)
	if err := c.client.Process(ctx, cmd); err != nil {
		return "", nil, nil, err
	}
	reply := cmd.Val()
	bad := func(what string) error { return fmt.Errorf("redisstream: xautoclaim reply: %s: %v", what, reply) }
	if len(reply) < 2 {
		return "", nil, nil, bad("too short")
	}
	next, ok := reply[0].(string)
	entries, ok2 := reply[1].([]any)
	if !ok || !ok2 {
		return "", nil, nil, bad("not a cursor and entries")
	}
	for _, en := range entries {
		pair, ok := en.([]any)
		if !ok || len(pair) != 2 {
			return "", nil, nil, bad("an entry")
		}
		id, ok := pair[0].(string)
		if !ok {
			return "", nil, nil, bad("an entry id")
		}
		if pair[1] == nil { // Redis 6.2: deleted, still pending
			deleted = append(deleted, id)
			continue
		}
		fields, ok := pair[1].([]any)
		if !ok || len(fields)%2 != 0 {
			return "", nil, nil, bad("an entry's fields")
		}
		values := make(map[string]any, len(fields)/2)
		for i := 0; i < len(fields); i += 2 {
			k, ok := fields[i].(string)
			if !ok {
				return "", nil, nil, bad("a field name")
			}
			values[k] = fields[i+1]
		}
		msgs = append(msgs, redis.XMessage{ID: id, Values: values})
	}
	if len(reply) > 2 {
		ids, ok := reply[2].([]any)
		if !ok {
			return "", nil, nil, bad("deleted ids")
		}
		for _, v := range ids {
			id, ok := v.(string)
			if !ok {
				return "", nil, nil, bad("a deleted id")
			}
			deleted = append(deleted, id)
		}
	}
	return next, msgs, deleted, nil
}

// deleted answers for pending entries found deleted from the stream: each
// is dead-lettered (ErrDeleted) when its record shows its effect did not
// complete and will not, so that a dead letter never invites running again
// an effect that ran (an operator re-drives a dead letter by adding its
// payload again, under a new entry id: a new key).
//
//   - completed: logged at Info level, not dead-lettered (only its XACK
//     was lost);
//   - pending with lease left: another consumer still runs it (Redis 7's
//     XAUTOCLAIM drops a deleted entry from the pending list however
//     recently it was delivered; MinIdle does not protect it). It is
//     watched: its record is read again at the start of each reclaim pass
//     (see recheck) until it settles, one way or the other;
//   - none (released, expired, or not yet claimed by the consumer that
//     has just read it: its XREADGROUP or XAUTOCLAIM answered, its claim
//     on the way): watched for MinIdle, as a pending entry waits MinIdle
//     before it is taken over, then dead-lettered if there is still none
//     (at once as Run returns);
//   - failed: watched for MinIdle likewise, since a failed record is
//     claimed again as a new one is (a retry by a consumer that has just
//     read the entry), then dead-lettered if still failed, the record
//     named in the cause; at once if its attempts ran out
//     (Processor.MaxAttempts), for no claim takes it then;
//   - pending with its lease run out and nobody holding it: its holder's
//     attempt recorded failed first (see takeOver: its holder, were it
//     still running past its lease, can no longer complete it), then
//     watched as a failed one;
//   - unreadable: dead-lettered, unless it is watched and the lease it
//     last showed (or its MinIdle without a record) has not yet run out:
//     it is read again on the next pass (as Run returns, one whose lease
//     has not run out is logged at Error level instead, as one still
//     held).
//
// Without Options.Process.Key the record is the entry's own; with it, the
// key is in the fields that are gone, the record cannot be found, and the
// entry is dead-lettered at once (its cause says the record is unknown).
// Those answered are acknowledged (Redis 6.2 keeps them pending); a dead
// letter that fails is logged at Error level with the id, for Redis 7 has
// already dropped the entry and will not name it again. For that reason
// too they are sent even once ctx has ended (a shutdown), within
// deletedTimeout.
func (c *Consumer) deleted(ctx context.Context, ids []string) {
	c.answer(ctx, ids, false)
}

// maxWatched bounds how many deleted entries a consumer watches (see
// deleted): one past it whose record shows a live holder is dead-lettered
// at once, as if unwatched, its cause naming the record (pending, with its
// lease left), and the log says the list was full. Entries are deleted
// under a live holder only while it runs them: a list this long means a
// mass trim under busy consumers. (A variable for tests.)
var maxWatched = 1024

// watched is a deleted entry whose record showed a live holder, or none
// yet.
type watched struct {
	until time.Time // when the lease the record last showed runs out (unclaimed: when to stop waiting for a claim)
	// unclaimed: it had no live holder when first found deleted (no
	// record, or a failed one), and is read again until a claim shows up,
	// for MinIdle.
	unclaimed bool
}

// recheck reads again the records of the watched deleted entries (see
// deleted) and answers those that settled. It runs at the start of each
// reclaim pass, so a watched entry is answered within ClaimEvery of its
// record settling; the reads are one per entry, never a wait for a lease.
func (c *Consumer) recheck(ctx context.Context) {
	if len(c.watch) == 0 {
		return
	}
	c.answer(ctx, slices.Sorted(maps.Keys(c.watch)), false)
}

// lastCheck is recheck as Run returns: the watched entries are gone from
// the pending list, and no one else knows of them. Those whose records
// have settled are answered as on any pass, and those with no record yet
// are dead-lettered without waiting out MinIdle; those still held elsewhere
// are not dead-lettered (their holder will most likely complete them; Run
// does not wait a lease to find out) but logged at Error level with the id
// and the record: if that holder fails, nothing runs the entry again and
// nothing dead-letters it.
func (c *Consumer) lastCheck(ctx context.Context) {
	if len(c.watch) == 0 {
		return
	}
	c.answer(ctx, slices.Sorted(maps.Keys(c.watch)), true)
}

// answer answers the deleted entries ids (see deleted); last is Run's
// last check (see lastCheck).
func (c *Consumer) answer(ctx context.Context, ids []string, last bool) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deletedTimeout)
	defer cancel()
	if c.watch == nil {
		c.watch = make(map[string]*watched)
	}
	ack := make([]string, 0, len(ids))
	// later keeps id for the next pass, when this one's time is spent:
	// Redis names a deleted entry once, so one given up for want of time
	// would be lost (neither run nor dead-lettered). It reports false as
	// Run returns (lastCheck), when there is no next pass.
	later := func(id string, w *watched) bool {
		if last || ctx.Err() == nil {
			return false
		}
		if w == nil { // found now: as if found on the next pass
			c.watch[id] = &watched{until: time.Now().Add(c.opts.MinIdle), unclaimed: true}
		}
		return true
	}
	for _, id := range ids {
		msg := consumerx.Message{ID: ID(c.opts.Stream, id), Metadata: map[string]string{}, Raw: redis.XMessage{ID: id}}
		w := c.watch[id]
		if later(id, w) {
			continue
		}
		// awaiting reports whether id, whose record shows no live holder
		// (none, or failed after attempt attempts), waits (now, or still)
		// for a claim by a consumer that may have just read it: for
		// MinIdle from when it was first found so, unless Run is
		// returning, too many are watched, or its attempts ran out (no
		// claim can take it then).
		awaiting := func(attempt int) bool {
			switch {
			case last, c.proc.MaxAttempts() > 0 && attempt >= c.proc.MaxAttempts():
				return false
			case w == nil && len(c.watch) < maxWatched:
				c.watch[id] = &watched{until: time.Now().Add(c.opts.MinIdle), unclaimed: true}
				return true
			}
			return w != nil && w.unclaimed && time.Now().Before(w.until)
		}
		record := "unknown: Options.Process.Key reads the fields"
		if c.opts.Process.Key == nil {
			rec, err := c.record(ctx, msg)
			held := err == nil && rec.State == guard.StatePending && rec.LeaseLeft > 0
			if held {
				until := time.Now().Add(rec.LeaseLeft)
				record = fmt.Sprintf("%s, attempt %d, lease left %s", rec.State, rec.Attempt, rec.LeaseLeft)
				switch {
				case last:
					c.log.ErrorContext(ctx, "redisstream: pending entry deleted from the stream, still running elsewhere as the consumer stops: not dead-lettered; if its effect does not complete, nothing will run it again",
						"id", id, "record", record)
					delete(c.watch, id)
					continue
				case w != nil:
					w.until, w.unclaimed = until, false
					continue
				case len(c.watch) < maxWatched:
					c.watch[id] = &watched{until: until}
					c.log.InfoContext(ctx, "redisstream: pending entry deleted from the stream while running elsewhere: watched until its record settles",
						"id", id, "record", record)
					continue
				}
				c.log.WarnContext(ctx, "redisstream: pending entry deleted from the stream while running elsewhere, and too many watched already: dead-lettered at once",
					"id", id, "record", record, "watched", len(c.watch))
			}
			switch {
			case held:
			case err == nil && rec.State == guard.StateCompleted:
				c.log.InfoContext(ctx, "redisstream: pending entry deleted from the stream; its effect had completed", "id", id)
				delete(c.watch, id)
				ack = append(ack, id)
				continue
			case errors.Is(err, guard.ErrNotFound):
				if awaiting(0) {
					continue
				}
				record = "none"
			case err != nil:
				if w != nil && time.Now().Before(w.until) && !last || later(id, w) {
					continue // read again on the next pass
				}
				if w != nil && !w.unclaimed && time.Now().Before(w.until) {
					c.log.ErrorContext(ctx, "redisstream: pending entry deleted from the stream, its record unreadable as the consumer stops, its lease not yet run out: not dead-lettered; if its effect does not complete, nothing will run it again",
						"id", id, "err", err)
					delete(c.watch, id)
					continue
				}
				record = "unreadable: " + err.Error()
			case err == nil && rec.State == guard.StatePending: // its lease ran out, nobody holding it
				out, terr := c.takeOver(ctx, msg, rec)
				switch {
				case terr == nil && out.Status == guard.Replay:
					c.log.InfoContext(ctx, "redisstream: pending entry deleted from the stream; its effect had completed", "id", id)
					delete(c.watch, id)
					ack = append(ack, id)
					continue
				case out.Status == guard.InProgress:
					// Claimed again since: watched as one held.
					if !last && (w != nil || len(c.watch) < maxWatched) {
						c.watch[id] = &watched{until: time.Now().Add(out.LeaseLeft)}
						continue
					}
					record = fmt.Sprintf("%s, lease left %s", guard.InProgress, out.LeaseLeft)
				case terr == nil:
					// Failed now: a consumer that has just read it may
					// claim it again, as any failed record.
					if awaiting(rec.Attempt) {
						continue
					}
					record = fmt.Sprintf("%s, attempt %d, lease run out; recorded failed, so that its holder cannot complete it", rec.State, rec.Attempt)
				default:
					record = fmt.Sprintf("%s, attempt %d, lease run out; not recorded failed: %v", rec.State, rec.Attempt, terr)
				}
			default: // failed
				if awaiting(rec.Attempt) {
					continue
				}
				record = fmt.Sprintf("%s, attempt %d", rec.State, rec.Attempt)
			}
		}
		cause := fmt.Errorf("%w (its record: %s)", ErrDeleted, record)
		// Under the entry's dead-letter record: the consumer that ran its
		// last attempt dead-letters it too (see sendOnce).
		sent, err := c.sendOnce(ctx, msg, func(ctx context.Context) error { return c.sendDeleted(ctx, msg, cause) })
		switch {
		case errors.Is(err, guard.ErrInProgress) && !last && (w != nil || len(c.watch) < maxWatched):
			// Another consumer is sending its dead letter: watched until
			// it is sent (or its sender fails, and this one sends it).
			c.watch[id] = &watched{until: time.Now()}
			continue
		case errors.Is(err, guard.ErrInProgress):
			delete(c.watch, id)
			c.log.WarnContext(ctx, "redisstream: pending entry deleted from the stream, its dead letter being sent by another consumer: not sent here",
				"id", id, "cause", cause)
			continue
		case later(id, w):
			continue // cut short by the pass's time: sent on the next pass
		case err != nil:
			delete(c.watch, id)
			c.log.ErrorContext(ctx, "redisstream: pending entry deleted from the stream and not dead-lettered: its effect may not have run",
				"id", id, "cause", cause, "err", err)
			continue
		case !sent:
			c.log.InfoContext(ctx, "redisstream: pending entry deleted from the stream; its dead letter was sent already", "id", id)
		default:
			c.log.ErrorContext(ctx, "redisstream: pending entry deleted from the stream: dead-lettered", "id", id, "cause", cause)
		}
		delete(c.watch, id)
		ack = append(ack, id)
	}
	if len(ack) > 0 {
		if err := c.client.XAck(ctx, c.opts.Stream, c.opts.Group, ack...).Err(); err != nil {
			c.log.WarnContext(ctx, "redisstream: xack failed", "ids", len(ack), "err", err)
		}
	}
}

// takeOver records the attempt of the holder of msg's key failed
// (ErrDeleted), in the holder's name (its owner token, read in rec): msg
// is a deleted entry whose record rec is pending with its lease run out.
// A holder still running past its lease (paused, or deaf to its context)
// can then no longer complete it (the store refuses its token: the record
// is failed), so the dead letter that follows holds. It does not claim
// the key: a claim needs the record's fingerprint, which a RedisStore
// keeps only as a digest when it is longer than 16 bytes (consumerx's
// default is 43), and the payload it was made from is gone with the
// entry. If the record has changed since rec was read (completed, failed,
// released or claimed again), it returns the outcome a claim would have
// had: Replay if the effect completed, InProgress if someone holds the
// key now, or the error.
func (c *Consumer) takeOver(ctx context.Context, msg consumerx.Message, rec guard.Record) (guard.Outcome, error) {
	key, err := c.proc.Key(msg)
	if err != nil {
		return guard.Outcome{}, err
	}
	holder := guard.Lease{Key: key, Token: rec.Token, Fence: rec.Fence, Attempt: rec.Attempt, Recovered: rec.Recovered}
	err = c.g.Fail(ctx, holder, ErrDeleted)
	if !errors.Is(err, guard.ErrLeaseLost) {
		return guard.Outcome{}, err
	}
	now, gerr := c.g.Get(ctx, key)
	switch {
	case gerr == nil && now.State == guard.StateCompleted:
		return guard.Outcome{Status: guard.Replay}, nil
	case gerr == nil && now.State == guard.StatePending && now.LeaseLeft > 0:
		return guard.Outcome{Status: guard.InProgress, LeaseLeft: now.LeaseLeft}, nil
	case gerr == nil && now.State == guard.StateFailed:
		return guard.Outcome{}, nil // failed: its holder (or a later one) cannot complete it
	}
	return guard.Outcome{}, err
}

// deletedTimeout bounds the answers for one XAUTOCLAIM's deleted entries,
// or one check of the watched ones; those it leaves unanswered are
// answered on the next pass (but as Run returns). (A variable for tests.)
var deletedTimeout = 5 * time.Second

// record reads the guard record of msg's key.
func (c *Consumer) record(ctx context.Context, msg consumerx.Message) (guard.Record, error) {
	key, err := c.proc.Key(msg)
	if err != nil {
		return guard.Record{}, err
	}
	return c.g.Get(ctx, key)
}

// sendDeleted dead-letters msg, a pending entry deleted from the stream;
// a panic of Options.Process.DeadLetter goes no further than an error,
// as consumerx's does (it would take the consumer down).
func (c *Consumer) sendDeleted(ctx context.Context, msg consumerx.Message, cause error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &guard.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return c.deadLetterFn(ctx, msg, cause)
}
