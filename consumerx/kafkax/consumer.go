// Package kafkax consumes Kafka records through a franz-go consumer group
// and runs each record's effect once per group, however often it is
// fetched again (after a crash or rebalance before the offset was
// committed) or produced again.
package kafkax

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// Defaults for Options.
const (
	DefaultMaxPollRecords = 100
	DefaultRetryDelay     = time.Second
)

// Options configure a Consumer. The zero value is ready to use.
type Options struct {
	// Group is the consumerx group records are deduplicated in. Default:
	// the client's consumer group.
	Group string
	// Process configures deduplication. Key defaults to ID:
	// "<topic>/<partition>/<offset>" (a digest of the topic when that is
	// too long for the guard), the same for every fetch of a record;
	// use a key function (of the record key or a header) to catch records
	// produced twice. Message.Metadata holds the headers, Message.Raw the
	// *kgo.Record. An offset names a record only while its topic lives: a
	// topic deleted and made again starts at offset 0, and for the guard's
	// TTL its records would be taken for the old ones (a Duplicate, never
	// run, if the value is the same; dead-lettered with guard.ErrMismatch
	// if not). Before making a topic again, give its consumers a new Group,
	// or key records by the producer's id.
	Process consumerx.Options
	// MaxPollRecords bounds the records taken per poll. Default 100.
	MaxPollRecords int
	// RetryDelay is the wait before a Failed or InProgress record runs
	// again (an InProgress one sooner when its holder's lease ends
	// sooner: the time the guard says it has left). Kafka has no
	// per-record nack: the record is retried in place,
	// holding back its partition (and the poll's commit), until it
	// succeeds or is dead-lettered after Process.MaxAttempts (with
	// kgo.BlockRebalanceOnPoll, also a waiting rebalance: see
	// OnPartitionsCallbackBlocked). Default 1s.
	RetryDelay time.Duration
	// Logger receives poll and commit errors. Default Process.Logger or
	// slog.Default().
	Logger *slog.Logger
}

// Consumer runs a consumer-group client's records through a handler.
type Consumer struct {
	client *kgo.Client
	proc   *consumerx.Processor
	h      consumerx.Handler
	opts   Options
	log    *slog.Logger
}

// batchFunc runs a partition's records in order and reports each one's
// outcome: Run's is Consumer.guarded (a benchmark passes the bare handler
// to loop).
type batchFunc func(ctx context.Context, msgs []consumerx.Message) []consumerx.BatchResult

// New returns a Consumer of client that runs h once per (group, record id)
// under g. The client must be made with kgo.ConsumerGroup and
// kgo.DisableAutoCommit: the Consumer commits a poll's offsets only after
// every record of it is done. With kgo.BlockRebalanceOnPoll, a rebalance
// waits until the poll is committed: make the client with
// OnPartitionsCallbackBlocked (in place of kgo's) too, so that the poll
// stops when a rebalance waits for it, instead of holding the group's
// rebalance while a record is retried in place or a handler runs (until
// the broker removes the member at kgo.RebalanceTimeout). Without
// kgo.BlockRebalanceOnPoll, make the client with OnPartitionsRevoked and
// OnPartitionsLost (in place of kgo's), so that a partition a rebalance
// takes mid-poll is stopped.
func New(client *kgo.Client, g *guard.Guard, h consumerx.Handler, opts Options) (*Consumer, error) {
	switch {
	case client == nil:
		return nil, errors.New("kafkax: nil client")
	case h == nil:
		return nil, errors.New("kafkax: nil handler")
	case opts.MaxPollRecords < 0, opts.RetryDelay < 0:
		return nil, errors.New("kafkax: negative MaxPollRecords or RetryDelay")
	}
	group, _ := client.OptValue(kgo.ConsumerGroup).(string)
	if group == "" {
		return nil, errors.New("kafkax: the client has no consumer group (kgo.ConsumerGroup)")
	}
	if off, _ := client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return nil, errors.New("kafkax: the client must be made with kgo.DisableAutoCommit(): autocommit would commit records not yet processed")
	}
	if opts.Group == "" {
		opts.Group = group
	}
	if opts.MaxPollRecords == 0 {
		opts.MaxPollRecords = DefaultMaxPollRecords
	}
	if opts.RetryDelay == 0 {
		opts.RetryDelay = DefaultRetryDelay
	}
	p, err := consumerx.NewProcessor(g, opts.Group, opts.Process)
	if err != nil {
		return nil, fmt.Errorf("kafkax: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = opts.Process.Logger
	}
	if log == nil {
		log = slog.Default()
	}
	return &Consumer{client: client, proc: p, h: h, opts: opts, log: log.With("group", opts.Group)}, nil
}

// Processor returns the consumerx.Processor records run through.
func (c *Consumer) Processor() *consumerx.Processor { return c.proc }

// ID returns the default id of r: "<topic>/<partition>/<offset>", or,
// when that is longer than guard.MaxIDLen (a topic name near Kafka's 249
// characters and a large offset), "sha256:<digest of the topic>/<partition>/<offset>"
// (the digest in unpadded base64url): a Kafka topic name holds no ':', so
// the two forms never meet, and every record has an id the guard can store.
func ID(r *kgo.Record) string {
	// "/<partition>/<offset>" on the stack: the id is the one allocation.
	var mem [1 + 11 + 1 + 20]byte
	po := strconv.AppendInt(append(strconv.AppendInt(append(mem[:0], '/'), int64(r.Partition), 10), '/'), r.Offset, 10)
	if len(r.Topic)+len(po) <= guard.MaxIDLen {
		return r.Topic + string(po)
	}
	sum := sha256.Sum256([]byte(r.Topic))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:]) + string(po)
}

// Run polls and processes records until ctx is cancelled or the client is
// closed (closing it is shutting down, as cancelling ctx is: a handler then
// running sees its context cancelled), then returns nil. On a client made
// with kgo.BlockRebalanceOnPoll, close it while Run runs with
// CloseAllowingRebalance: a plain Close first leaves the group, which waits
// for the poll being processed (without OnPartitionsCallbackBlocked's
// signal), and a record retried in place holds that poll until it is
// acknowledged. Each poll's partitions run at once, each in a goroutine of
// its own that ends with the poll; inside a partition the records run one
// at a time, in offset order. A partition's records are claimed together,
// in one round trip, and completed together in another
// (consumerx.Processor.ProcessBatch, Ordered): a record that is not
// acknowledged (failed, in progress elsewhere) stops its partition there,
// its later records are released unrun, and it is retried in place after
// RetryDelay, with the records after it, until it is acknowledged. Then the
// poll's offsets are committed. Once ctx is cancelled nothing more is
// committed: the records of the unfinished poll are fetched again by the
// next member and found done (Duplicate) or not. A handler running when ctx
// ends sees its context cancelled; if it then returns an error, the record
// is Interrupted: its claim is released, no attempt is counted and nothing
// is dead-lettered, and the next member runs it again. A handler that calls
// runtime.Goexit leaves its record unacknowledged (released, no attempt
// counted): its partition is taken up again from the poll's first record
// after RetryDelay. When a rebalance revokes a partition (or the member
// loses it) while its records run, on a client made with
// OnPartitionsRevoked and OnPartitionsLost, its handlers see their context
// end with cause ErrRevoked (a record whose handler then returns an error
// is Interrupted, as at shutdown), its records are retried in place no more
// and are not committed, and the poll goes on for the other partitions and
// is committed for them. When a rebalance waits for the poll, on a client
// made with kgo.BlockRebalanceOnPoll and OnPartitionsCallbackBlocked, every
// partition of the poll stops so (with cause ErrRebalancing), its records
// acknowledged from the first are committed, and the rest are fetched again
// after the rebalance, from the first not acknowledged. Run allows
// rebalances again before it returns, so the client can be closed with
// Close or CloseAllowingRebalance. While another Run polls the same client
// (a second Consumer of it, or this one's), Run returns ErrRunning at once.
func (c *Consumer) Run(ctx context.Context) error {
	return c.loop(ctx, c.guarded)
}

// loop is Run with each partition's records run by batch.
func (c *Consumer) loop(ctx context.Context, batch batchFunc) error {
	// The poll's partitions, stopped when a rebalance takes them (see
	// OnPartitionsRevoked). First: a Run refused must not let another's
	// poll go (AllowRebalance, below).
	tr, err := track(c.client)
	if err != nil {
		return err
	}
	defer tr.untrack()
	// Closing the client is shutting down, as cancelling ctx is: a record
	// retried in place, or a handler running, must not go on for ever on a
	// closed client (the client's context ends when it is closed).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.client.Context(), cancel)()
	// A poll blocks rebalances (kgo.BlockRebalanceOnPoll) until allowed:
	// the last one must not keep them blocked once Run has returned, or the
	// client's Close hangs.
	defer c.client.AllowRebalance()
	for ctx.Err() == nil {
		since := tr.mark()
		fetches := c.client.PollRecords(ctx, c.opts.MaxPollRecords)
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if ctx.Err() == nil {
				c.log.WarnContext(ctx, "kafkax: fetch failed", "topic", topic, "partition", p, "err", err)
			}
		})
		var wg sync.WaitGroup
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				c.spawn(tr.add(ctx, p.Topic, p.Partition, p.Records, since), &wg, batch)
			}
		})
		wg.Wait()
		// A revoked partition's records are not committed: the new owner
		// may have committed past them already, and franz-go would send
		// the commit. A revocation between here and the commit is not
		// seen (kgo.BlockRebalanceOnPoll closes that window): the commit
		// is sent (franz-go holds it during a join, so an eager rebalance
		// may be done by then), and if the broker takes it after the new
		// owner's, the partition's offset goes back. The records between
		// the two are done: fetched again (by the owner after the next
		// rebalance; the new owner's next commit moves the offset on),
		// they are Duplicates while the guard keeps them (guard.Options.TTL)
		// (TestStaleCommitRecordsFoundDone).
		recs, stopped, rewind := tr.done()
		// A revoked partition given back (an eager rebalance while the
		// poll waited) is fetched again from its records skipped, and one
		// stopped for a waiting rebalance, or left unfinished by this Run's
		// end, from its first not acknowledged.
		c.client.SetOffsets(rewind)
		if stopped || ctx.Err() != nil {
			break
		}
		if len(recs) > 0 {
			if err := c.client.CommitRecords(ctx, recs...); err != nil && ctx.Err() == nil {
				// Uncommitted records come back and are found done.
				c.log.WarnContext(ctx, "kafkax: commit failed", "err", err)
			}
		}
		c.client.AllowRebalance()
	}
	return nil
}

// guarded runs a partition's records through the processor: their claims
// in one round trip, the records in order, their completions in another.
func (c *Consumer) guarded(ctx context.Context, msgs []consumerx.Message) []consumerx.BatchResult {
	growStack()
	return c.proc.ProcessBatch(ctx, msgs, c.h, consumerx.BatchOptions{Ordered: true})
}

// growStack grows the stack of a partition's goroutine, new with every
// poll, while it holds a few frames: the batch's claims and writes run
// some 8 KB deeper, where each growth would copy every frame above it
// (franz-go's workers do the same: kgo's growStack).
//
//go:noinline
func growStack() {
	var b [8 << 10]byte
	b[0] = 1
	runtime.KeepAlive(&b)
}

// spawn runs one partition's records of a poll, pt.recs, on a goroutine of
// wg, and sets pt.stopped if pt.ctx ended first. A handler that calls
// runtime.Goexit ends that goroutine inside a batch whose claims the
// guard then ends (that record's released, no attempt counted): the
// record is not acknowledged, so the partition is taken up again, after
// RetryDelay as after a failed record, on a goroutine of its own, from
// the poll's first record (those already done are Duplicates), and the
// poll is committed only once every record is acknowledged.
func (c *Consumer) spawn(pt *part, wg *sync.WaitGroup, batch batchFunc) {
	wg.Go(func() {
		returned := false
		defer func() {
			if returned {
				return
			}
			if p := recover(); p != nil {
				panic(p) // not the Goexit: goes on as it would have
			}
			if !wait.For(pt.ctx, c.opts.RetryDelay) {
				pt.stopped.Store(true)
				return
			}
			c.spawn(pt, wg, batch)
		}()
		if !c.partition(pt, batch) {
			pt.stopped.Store(true)
		}
		returned = true
	})
}

// partition runs one partition's records of a poll through batch, in
// order, until every one is acknowledged; false if pt.ctx ended first.
// pt.acked counts the records acknowledged from the first.
func (c *Consumer) partition(pt *part, batch batchFunc) bool {
	ctx := pt.ctx
	msgs := make([]consumerx.Message, len(pt.recs))
	for i, r := range pt.recs {
		msgs[i] = message(r)
	}
	base := 0 // msgs[0]'s index in pt.recs
	for {
		res := batch(ctx, msgs)
		k := 0
		for k < len(res) && res[k].Outcome.Ack() {
			k++
		}
		if n := int32(base + k); n > pt.acked.Load() {
			pt.acked.Store(n)
		}
		if k == len(res) {
			return true
		}
		msgs, base = msgs[k:], base+k
		o, err := res[k].Outcome, res[k].Err
		switch o {
		case consumerx.Interrupted:
			return false
		case consumerx.Skipped:
			continue // after a dead letter: go on at once
		}
		delay := c.opts.RetryDelay
		var ip *guard.InProgressError
		if errors.As(err, &ip) && ip.RetryAfter > 0 {
			delay = min(delay, ip.RetryAfter)
		}
		if !wait.For(ctx, delay) {
			return false
		}
	}
}

// message is r as a consumerx.Message.
func message(r *kgo.Record) consumerx.Message {
	msg := consumerx.Message{ID: ID(r), Payload: r.Value, Raw: r}
	if len(r.Headers) > 0 {
		msg.Metadata = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			msg.Metadata[h.Key] = string(h.Value)
		}
	}
	return msg
}

// Header keys of a dead-letter record made by ProduceDeadLetter.
const (
	HeaderDeadReason = "consumerx-dead-reason" // the cause, as text (consumerx.DeadLetterReason)
	HeaderDeadSource = "consumerx-dead-source" // the original record's id
)

// ProduceDeadLetter returns a consumerx.Options.DeadLetter that produces
// the record, with its key, value and headers and the HeaderDead* headers,
// to topic through client, and waits for the broker's acknowledgement.
func ProduceDeadLetter(client *kgo.Client, topic string) func(context.Context, consumerx.Message, error) error {
	return func(ctx context.Context, msg consumerx.Message, cause error) error {
		dead := &kgo.Record{Topic: topic, Value: msg.Payload}
		if r, ok := msg.Raw.(*kgo.Record); ok {
			dead.Key = r.Key
			dead.Headers = append(dead.Headers, r.Headers...)
		}
		dead.Headers = append(dead.Headers,
			kgo.RecordHeader{Key: HeaderDeadReason, Value: []byte(consumerx.DeadLetterReason(cause))},
			kgo.RecordHeader{Key: HeaderDeadSource, Value: []byte(msg.ID)})
		if err := client.ProduceSync(ctx, dead).FirstErr(); err != nil {
			return fmt.Errorf("kafkax: produce dead letter to %s: %w", topic, err)
		}
		return nil
	}
}
