package redisstream

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// ErrDeleted is the cause an entry is dead-lettered with when it was
// deleted from the stream (XDEL, XTRIM, MAXLEN) while pending, before
// its effect was known to have completed: its fields are gone, so it
// cannot run. The dead letter carries its id alone; Options.Process's
// OnOutcome does not hear of it (nothing was delivered).
var ErrDeleted = errors.New("redisstream: entry deleted from the stream while pending")

// autoClaim sends XAUTOCLAIM and returns where the pass goes on, the
// entries it handed over, and the ids of pending entries no longer in the
// stream: Redis 7 drops those from the pending list itself and names them
// apart (go-redis's XAutoClaim discards them), Redis 6.2 hands them over
// without fields.
func (c *Consumer) autoClaim(ctx context.Context, cursor string) (next string, msgs []redis.XMessage, deleted []string, err error) {
	minIdle := c.opts.MinIdle.Milliseconds()
	if minIdle == 0 {
		minIdle = 1 // as go-redis sends a positive duration under 1ms
	}
	cmd := redis.NewSliceCmd(ctx, "xautoclaim", c.opts.Stream, c.opts.Group, c.opts.Consumer,
		minIdle, cursor, "count", c.opts.Count)
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
// is dead-lettered (ErrDeleted) unless its record shows its effect
// completed (only its XACK was lost: a dead letter would invite running
// it again). Without Options.Process.Key the record is the entry's own;
// with it, the key is in the fields that are gone, and the entry is
// dead-lettered. Those answered are acknowledged (Redis 6.2 keeps them
// pending); a dead letter that fails is logged at Error level with the
// id, for Redis 7 has already dropped the entry and will not name it
// again. For that reason too they are sent even once ctx has ended (a
// shutdown), within deletedTimeout.
func (c *Consumer) deleted(ctx context.Context, ids []string) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deletedTimeout)
	defer cancel()
	ack := make([]string, 0, len(ids))
	for _, id := range ids {
		msg := consumerx.Message{ID: ID(c.opts.Stream, id), Metadata: map[string]string{}, Raw: redis.XMessage{ID: id}}
		record := "unknown: Options.Process.Key reads the fields"
		if c.opts.Process.Key == nil {
			rec, err := c.record(ctx, msg)
			switch {
			case err == nil && rec.State == guard.StateCompleted:
				c.log.InfoContext(ctx, "redisstream: pending entry deleted from the stream; its effect had completed", "id", id)
				ack = append(ack, id)
				continue
			case errors.Is(err, guard.ErrNotFound):
				record = "none"
			case err != nil:
				record = "unreadable: " + err.Error()
			default:
				record = fmt.Sprintf("%s, attempt %d", rec.State, rec.Attempt)
			}
		}
		cause := fmt.Errorf("%w (its record: %s)", ErrDeleted, record)
		if err := c.sendDeleted(ctx, msg, cause); err != nil {
			c.log.ErrorContext(ctx, "redisstream: pending entry deleted from the stream and not dead-lettered: its effect may not have run",
				"id", id, "cause", cause, "err", err)
			continue
		}
		c.log.ErrorContext(ctx, "redisstream: pending entry deleted from the stream: dead-lettered", "id", id, "cause", cause)
		ack = append(ack, id)
	}
	if len(ack) > 0 {
		if err := c.client.XAck(ctx, c.opts.Stream, c.opts.Group, ack...).Err(); err != nil {
			c.log.WarnContext(ctx, "redisstream: xack failed", "ids", len(ack), "err", err)
		}
	}
}

// deletedTimeout bounds the answers for one XAUTOCLAIM's deleted entries.
const deletedTimeout = 5 * time.Second

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
