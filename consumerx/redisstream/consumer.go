// Package redisstream consumes a Redis Stream through a consumer group and
// runs each entry's effect once per group, however often the entry is
// delivered or the same logical message is added again.
//
// A Consumer reads new entries with XREADGROUP, takes over entries left
// pending by a dead or stuck consumer with XAUTOCLAIM, acknowledges with
// XACK, and moves entries that cannot succeed to a dead-letter stream.
package redisstream

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/leasectx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// Defaults for Options.
const (
	DefaultPayloadField = "payload"
	DefaultCount        = 16
	DefaultBlock        = time.Second
	DefaultMinIdle      = 30 * time.Second
	DeadLetterSuffix    = ":dead" // the dead-letter stream is Stream + DeadLetterSuffix by default
)

// Fields a dead-letter entry carries besides the original entry's fields.
const (
	FieldDeadID     = "dead_id"     // the original entry id
	FieldDeadStream = "dead_stream" // the stream it was read from
	FieldDeadGroup  = "dead_group"  // the consumer group that gave up on it
	FieldDeadError  = "dead_error"  // why: the last error (consumerx.DeadLetterReason)
)

// Options configure a Consumer. Stream, Group and Consumer are required;
// the other fields have working defaults.
type Options struct {
	// Stream is the key of the stream to read.
	Stream string
	// Group is the Redis consumer group, created (with MKSTREAM, from
	// Start) if it does not exist when Run starts. It is also the
	// consumerx group: effects run once per Group and Message.ID, which
	// names the stream (see ID), so groups of one name on several streams
	// each run their own entries.
	//
	// When a command of the running consumer finds the group gone
	// (NOGROUP: the group destroyed, the stream deleted; or, blocked in
	// XREADGROUP, is told the stream was deleted) the consumer
	// creates it again, not from Start, but after the highest entry id it
	// knows the lost group delivered: the group's last delivered id when
	// Run started, or the highest id read since, whichever is higher.
	// Entries the lost group had delivered are not delivered again (their
	// guard records may have expired: their effects would run again); the
	// others, and entries added later, are. Consumers of the group that
	// find it gone in turn each move it forward to their own id, never
	// back, so it ends after the highest id any of them had read (until
	// the last of them has, within a Block or so, a consumer that had read
	// less may be given entries another had read after it: their records,
	// made since, find them done unless they have already expired). A
	// consumer busy running a batch while another made the group again
	// does not find it gone (its next XREADGROUP succeeds) and does not
	// move it: entries it alone had read since the other's last read are
	// delivered again, and run again only if their records have expired.
	// Entries pending in the lost group (delivered, not acknowledged:
	// running, or failed and waiting for their retry) are gone with its
	// pending list and are not delivered again: one running completes
	// (its XACK finds nothing to acknowledge); one whose claim was left
	// in progress keeps it until its lease ends, one that had failed is
	// not retried. Nothing runs twice, but those need an operator: add
	// them again, or XGROUP SETID the group back, which delivers again
	// everything after that id. A stream made again (deleted, then added
	// to) whose last id is behind the group's gets the group's id as its
	// last id (XSETID): an XADD with "*" gets an id above it, one with an
	// explicit id at or below it is refused rather than never delivered;
	// entries a producer had already added below it are not delivered,
	// and the consumer logs that at Error level. To start a stream and
	// its group over, stop the consumers first.
	Group string
	// Consumer names this consumer inside the group; each concurrent
	// consumer needs its own name.
	Consumer string
	// Start is the id a group created when Run starts, because it does not
	// exist, starts after. Default "0" (every entry in the stream); "$"
	// reads only entries added later. It is not used when a running
	// consumer creates the group again (see Group).
	Start string
	// PayloadField is the entry field given as Message.Payload; the other
	// fields are Message.Metadata. Default "payload".
	PayloadField string
	// Count is the most entries read (or reclaimed) at a time. Default 16.
	Count int64
	// Concurrency is how many entries of a batch run at once. Default 1
	// (one after the other). Run waits for the whole batch before it
	// acknowledges it and reads the next.
	Concurrency int
	// Block is how long one XREADGROUP waits for entries. It bounds how
	// long Run takes to return after ctx is cancelled. Default 1s.
	Block time.Duration
	// MinIdle is how long an entry must have been pending (delivered, not
	// acknowledged) before this consumer takes it over with XAUTOCLAIM: the
	// retry delay of failed and in-progress entries, and the time a dead
	// consumer's entries wait. Keep it above the longest handler run.
	// Default 30s.
	MinIdle time.Duration
	// ClaimEvery is how often XAUTOCLAIM runs. Default MinIdle/2.
	ClaimEvery time.Duration
	// DeadLetterStream receives, with XADD, every entry that cannot succeed
	// (see consumerx.DeadLettered), with its fields and the Field* fields
	// above, and every pending entry found deleted from the stream whose
	// effect did not complete and will not (ErrDeleted), with the Field*
	// fields alone. An entry is added once, though both happen to it
	// (its last attempt fails while it is deleted): see ErrDeleted.
	// Default Stream + ":dead".
	DeadLetterStream string
	// Process configures deduplication: key and fingerprint functions,
	// attempts, logging. Its DeadLetter, if set, is called after the
	// entry was added to DeadLetterStream; if it fails, dead-lettering is
	// retried on the next delivery without adding the entry again (the
	// addition is a recorded step, guard.Step, where the store records
	// steps).
	Process consumerx.Options
	// Logger receives Redis errors of the read loop. Default
	// Process.Logger, or slog.Default().
	Logger *slog.Logger
}

// Consumer is one member of a consumer group. Run it once; run many
// Consumers (with distinct names) for concurrency.
type Consumer struct {
	client  redis.UniversalClient
	g       *guard.Guard
	opts    Options
	proc    *consumerx.Processor
	handler consumerx.Handler
	log     *slog.Logger
	// deadLetterFn sends a dead letter: the dead-letter stream, then
	// Options.Process.DeadLetter. The processor's DeadLetter runs it under
	// the entry's dead-letter record (sendOnce), as deleted does.
	deadLetterFn func(ctx context.Context, msg consumerx.Message, cause error) error
	// read is the highest entry id the group is known to have delivered:
	// its last delivered id when Run started, then the highest id read
	// since. A group created again starts there (see noGroup). Only Run's
	// goroutine uses it.
	read string
	// watch holds, by entry id, the pending entries found deleted from
	// the stream while another holder's lease had time left, until their
	// records settle (see deleted); at most maxWatched. Only Run's
	// goroutine uses it.
	watch map[string]*watched
}

// batchFunc runs a batch of entries and reports which to acknowledge:
// Run's is Consumer.guarded (a benchmark passes the bare handler to loop).
type batchFunc func(ctx context.Context, msgs []consumerx.Message) []bool

// New returns a Consumer of opts.Stream that runs h once per (Group,
// message id) under g.
func New(client redis.UniversalClient, g *guard.Guard, h consumerx.Handler, opts Options) (*Consumer, error) {
	switch {
	case client == nil:
		return nil, errors.New("redisstream: nil client")
	case h == nil:
		return nil, errors.New("redisstream: nil handler")
	case opts.Stream == "":
		return nil, errors.New("redisstream: Options.Stream is required")
	case opts.Group == "":
		return nil, errors.New("redisstream: Options.Group is required")
	case opts.Consumer == "":
		return nil, errors.New("redisstream: Options.Consumer is required")
	case opts.Count < 0, opts.Concurrency < 0, opts.Block < 0, opts.MinIdle < 0, opts.ClaimEvery < 0:
		return nil, errors.New("redisstream: Count, Concurrency, Block, MinIdle and ClaimEvery must not be negative")
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 1
	}
	if opts.Start == "" {
		opts.Start = "0"
	}
	if opts.PayloadField == "" {
		opts.PayloadField = DefaultPayloadField
	}
	if opts.Count == 0 {
		opts.Count = DefaultCount
	}
	if opts.Block == 0 {
		opts.Block = DefaultBlock
	}
	if opts.MinIdle == 0 {
		opts.MinIdle = DefaultMinIdle
	}
	if opts.ClaimEvery == 0 {
		opts.ClaimEvery = max(opts.MinIdle/2, time.Millisecond)
	}
	if opts.DeadLetterStream == "" {
		opts.DeadLetterStream = opts.Stream + DeadLetterSuffix
	}
	if opts.DeadLetterStream == opts.Stream {
		return nil, errors.New("redisstream: DeadLetterStream must differ from Stream")
	}
	log := opts.Logger
	if log == nil {
		log = opts.Process.Logger
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Consumer{client: client, g: g, opts: opts, handler: h,
		log: log.With("stream", opts.Stream, "group", opts.Group, "consumer", opts.Consumer)}
	popts := opts.Process
	user := popts.DeadLetter
	c.deadLetterFn = func(ctx context.Context, msg consumerx.Message, cause error) error {
		if user == nil {
			return c.deadLetter(ctx, msg, cause)
		}
		if err := c.deadLetterOnce(ctx, msg, cause); err != nil {
			return err
		}
		if l, ok := ctx.Value(entryLease{}).(guard.Lease); ok {
			// The entry's dead-letter record, which both paths claim:
			// the steps the user's DeadLetter records under it
			// (LeaseFrom) are found whichever path tries it again.
			ctx = leasectx.With(ctx, l)
		}
		return user(ctx, msg, cause)
	}
	// Under the entry's own dead-letter record, which a consumer that
	// finds the entry deleted sends under too (see sendOnce and
	// sendOnceAfter).
	popts.DeadLetter = func(ctx context.Context, msg consumerx.Message, cause error) error {
		sent, err := c.sendOnceAfter(ctx, msg, func(ctx context.Context) error { return c.deadLetterFn(ctx, msg, cause) })
		if err == nil && !sent {
			c.log.InfoContext(ctx, "redisstream: the entry's dead letter was sent already: not sent again", "id", msg.ID)
		}
		return err
	}
	proc, err := consumerx.NewProcessor(g, opts.Group, popts)
	if err != nil {
		return nil, fmt.Errorf("redisstream: %w", err)
	}
	c.proc = proc
	return c, nil
}

// Processor returns the consumerx.Processor the consumer runs messages
// through (for its Key, to inspect a message's record).
func (c *Consumer) Processor() *consumerx.Processor { return c.proc }

// Run consumes until ctx is cancelled, then returns nil; it returns an
// error only if the group cannot be created, or once it finds its client
// closed (an error matching redis.ErrClosed: a closed client never works
// again; the entries it had not acknowledged stay pending, for another
// consumer to take over after MinIdle). The goroutines it starts end
// with each batch. Each round it takes over entries pending longer than
// MinIdle (XAUTOCLAIM), then reads new entries (XREADGROUP), and runs each
// batch through consumerx.Processor.ProcessBatch: the batch's claims in
// one round trip, the handlers (Concurrency at once), the completions,
// failures and releases in one more, then one XACK for the entries to
// acknowledge. Pending entries XAUTOCLAIM reports deleted from the stream
// are dead-lettered (ErrDeleted) unless their records show their effects
// completed; one still running elsewhere, or with no record yet or a
// failed one that may be claimed again (for MinIdle), is watched (at most 1024 at once), its record read again at
// the start of each reclaim pass until it settles. Once ctx is cancelled it sends nothing more but the answers for
// deleted entries (Redis has dropped them from the pending list and will
// not name them again): those just reported, and, as Run returns, one
// last read of the watched ones: those settled are answered, those still
// running elsewhere are logged at Error level with their ids and records,
// not dead-lettered (Run does not wait a lease for them). Entries it had
// not acknowledged stay pending, and the consumer that takes them over
// finds them done (Duplicate) or not. A
// handler running when ctx is cancelled sees its context cancelled; if it
// then returns an error, the entry is Interrupted: its claim is released,
// no attempt is counted and nothing is dead-lettered, and the consumer
// that takes the entry over (XAUTOCLAIM, after MinIdle) runs it again.
func (c *Consumer) Run(ctx context.Context) error {
	return c.loop(ctx, c.guarded)
}

// loop is Run with each batch run by batch.
func (c *Consumer) loop(ctx context.Context, batch batchFunc) error {
	if err := c.createGroup(ctx); err != nil {
		return err
	}
	nextClaim := time.Now()
	cursor := "0-0"         // where the next XAUTOCLAIM goes on in the pending list
	var pause time.Duration // back-off after a Redis error
	var closed error        // the client was closed: it never opens again
	for ctx.Err() == nil {
		if pause > 0 {
			if !wait.For(ctx, pause) {
				break
			}
		}
		if !time.Now().Before(nextClaim) {
			next, err := c.reclaim(ctx, cursor, batch)
			if errors.Is(err, redis.ErrClosed) {
				closed = fmt.Errorf("redisstream: xautoclaim: %w", err)
				break
			}
			if err != nil {
				// Retried at once (the pass is still due): without the
				// group made again, it would fail for ever.
				pause = c.failed(ctx, "xautoclaim", c.noGroup(ctx, err), pause)
				continue
			}
			if cursor = next; cursor == "0-0" { // a pass over the pending list is done
				nextClaim = time.Now().Add(c.opts.ClaimEvery)
			}
		}
		res, err := c.client.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: c.opts.Group, Consumer: c.opts.Consumer,
			Streams: []string{c.opts.Stream, ">"},
			// At least 1ms: go-redis sends whole milliseconds, and BLOCK 0
			// waits for ever.
			Count: c.opts.Count, Block: max(min(c.opts.Block, time.Until(nextClaim)), time.Millisecond),
		}).Result()
		if errors.Is(err, redis.Nil) {
			pause = 0
			continue
		}
		if errors.Is(err, redis.ErrClosed) {
			closed = fmt.Errorf("redisstream: xreadgroup: %w", err)
			break
		}
		if err != nil {
			pause = c.failed(ctx, "xreadgroup", c.noGroup(ctx, err), pause)
			continue
		}
		pause = 0
		for _, s := range res {
			c.handle(ctx, s.Messages, batch)
		}
	}
	c.lastCheck(ctx)
	return closed
}

// failed logs a Redis error of the loop and returns the next back-off.
func (c *Consumer) failed(ctx context.Context, op string, err error, wait time.Duration) time.Duration {
	if ctx.Err() != nil {
		return 0
	}
	c.log.WarnContext(ctx, "redisstream: "+op+" failed", "err", err)
	return min(max(2*wait, 50*time.Millisecond), 5*time.Second)
}

// reclaim takes over and handles up to Count entries pending longer than
// MinIdle, from cursor on; it returns where the pass goes on, "0-0" at the
// end of the pending list. Pending entries found deleted from the stream
// are answered (see deleted); a pass starts by reading again the records
// of those watched (recheck).
func (c *Consumer) reclaim(ctx context.Context, cursor string, batch batchFunc) (string, error) {
	if cursor == "0-0" {
		c.recheck(ctx)
	}
	// Read first, the pending entries gone from the stream that
	// XAUTOCLAIM is about to name: Redis 7 names them once, in a reply a
	// dropped connection can lose (go-redis then sends XAUTOCLAIM again,
	// whose reply no longer names them, and they would be lost).
	before, err := c.gonePending(ctx, cursor)
	if err != nil {
		return cursor, err
	}
	next, msgs, gone, err := c.autoClaim(ctx, cursor)
	if err != nil {
		return cursor, err
	}
	for _, id := range before {
		if !slices.Contains(gone, id) {
			gone = append(gone, id)
		}
	}
	c.deleted(ctx, gone)
	c.handle(ctx, msgs, batch)
	if next == "" {
		next = "0-0"
	}
	return next, nil
}

// handle runs a batch through batch and acknowledges, with one XACK, the
// entries whose outcome says so.
func (c *Consumer) handle(ctx context.Context, xms []redis.XMessage, batch batchFunc) {
	if len(xms) == 0 {
		return
	}
	msgs := make([]consumerx.Message, len(xms))
	for i := range xms {
		msgs[i] = c.message(xms[i])
		c.read = maxID(c.read, xms[i].ID)
	}
	acked := batch(ctx, msgs)
	if ctx.Err() != nil {
		return
	}
	ack := make([]string, 0, len(msgs))
	for i, xm := range xms {
		if acked[i] {
			ack = append(ack, xm.ID)
		}
	}
	if len(ack) == 0 {
		return
	}
	if err := c.client.XAck(ctx, c.opts.Stream, c.opts.Group, ack...).Err(); err != nil && ctx.Err() == nil {
		// The entries stay pending; whoever reclaims them finds them done.
		c.log.WarnContext(ctx, "redisstream: xack failed", "ids", len(ack), "err", err)
	}
}

// guarded runs a batch through the processor: its claims in one round
// trip, its completions in another (consumerx.Processor.ProcessBatch).
func (c *Consumer) guarded(ctx context.Context, msgs []consumerx.Message) []bool {
	res := c.proc.ProcessBatch(ctx, msgs, c.handler, consumerx.BatchOptions{Concurrency: c.opts.Concurrency})
	acked := make([]bool, len(res))
	for i, r := range res {
		acked[i] = r.Outcome.Ack()
	}
	return acked
}

// ID returns the Message.ID of the entry with id entry in stream: it names
// the stream, since a consumer group's name is often used on many streams
// and an entry id is unique only inside its stream. It is "<stream>/<entry id>", or, when
// that is not a usable guard id (longer than guard.MaxIDLen, control
// characters, invalid UTF-8), "sha256:<digest of the stream name>/<entry id>"
// (the digest in unpadded base64url).
func ID(stream, entry string) string {
	id := stream + "/" + entry
	if (guard.Key{Scope: "s", ID: id}).Validate() == nil {
		return id
	}
	sum := sha256.Sum256([]byte(stream))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:]) + "/" + entry
}

func (c *Consumer) message(xm redis.XMessage) consumerx.Message {
	msg := consumerx.Message{ID: ID(c.opts.Stream, xm.ID), Metadata: make(map[string]string, len(xm.Values)), Raw: xm}
	for k, v := range xm.Values {
		s, ok := v.(string)
		if !ok {
			s = fmt.Sprint(v)
		}
		if k == c.opts.PayloadField {
			msg.Payload = []byte(s)
			continue
		}
		msg.Metadata[k] = s
	}
	return msg
}

// deadLetter adds msg's entry to the dead-letter stream.
func (c *Consumer) deadLetter(ctx context.Context, msg consumerx.Message, cause error) error {
	xm, ok := msg.Raw.(redis.XMessage)
	if !ok {
		xm.ID = msg.ID
	}
	values := make([]any, 0, 2*len(xm.Values)+8)
	for k, v := range xm.Values {
		values = append(values, k, v)
	}
	values = append(values,
		FieldDeadID, xm.ID, FieldDeadStream, c.opts.Stream,
		FieldDeadGroup, c.opts.Group, FieldDeadError, consumerx.DeadLetterReason(cause))
	var err error
	if len(values) <= maxScriptFields {
		args := append([]any{xm.ID, c.opts.Stream, c.opts.Group}, values...)
		err = deadLetterScript.Run(ctx, c.client, []string{c.opts.DeadLetterStream}, args...).Err()
	} else {
		err = c.client.XAdd(ctx, &redis.XAddArgs{Stream: c.opts.DeadLetterStream, Values: values}).Err()
	}
	if err != nil {
		return fmt.Errorf("redisstream: xadd %s: %w", c.opts.DeadLetterStream, err)
	}
	return nil
}

// maxScriptFields is the most field names and values deadLetterScript
// passes on to XADD: Lua's unpack takes about 8,000 values. A dead
// letter with more (an entry of over 3,500 fields) is added with a plain
// XADD, which a lost answer can make twice.
const maxScriptFields = 7000

// deadLetterScript adds the dead letter ARGV[4:] (field, value, ...) to
// the stream KEYS[1], unless one of its last 64 entries is already the
// dead letter of entry ARGV[1] of stream ARGV[2] for group ARGV[3] (its
// dead_* fields, the last of each name: they follow the entry's own): a
// client re-sends a command whose answer it lost, and an XADD sent twice
// adds the entry twice (an operator re-driving both would make the effect
// twice, under two entry ids). It returns the entry's id.
var deadLetterScript = redis.NewScript(`
for _, e in ipairs(redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 64)) do
  local f, id, stream, group = e[2], nil, nil, nil
  for i = 1, #f, 2 do
    if f[i] == '` + FieldDeadID + `' then id = f[i + 1]
    elseif f[i] == '` + FieldDeadStream + `' then stream = f[i + 1]
    elseif f[i] == '` + FieldDeadGroup + `' then group = f[i + 1] end
  end
  if id == ARGV[1] and stream == ARGV[2] and group == ARGV[3] then return e[1] end
end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
`)

// deadLetterOnce adds msg's entry to the dead-letter stream as a recorded
// step of its dead-letter record (guard.Step): the entry's own (sendOnce),
// which both paths claim, or else consumerx's. So when the user's
// DeadLetter after it fails and dead-lettering is retried, on the next
// delivery or by the consumer that finds the entry deleted, the entry is
// not added again. Without a lease (a message with no id at all) or a
// store that records no steps, it just adds it.
func (c *Consumer) deadLetterOnce(ctx context.Context, msg consumerx.Message, cause error) error {
	lease, ok := ctx.Value(entryLease{}).(guard.Lease)
	if !ok {
		lease, ok = consumerx.LeaseFrom(ctx)
	}
	if !ok {
		return c.deadLetter(ctx, msg, cause)
	}
	_, err := guard.Step(ctx, lease, "xadd", func(ctx context.Context) ([]byte, error) {
		return nil, c.deadLetter(ctx, msg, cause)
	})
	if errors.Is(err, guard.ErrStepsUnsupported) {
		return c.deadLetter(ctx, msg, cause)
	}
	return err
}
