// Package jetstreamx runs a NATS JetStream consumer's messages once per
// group, however often JetStream delivers them (redeliveries after a Nak,
// an expired AckWait or a lost ack) and however often a publisher sent the
// same message outside the stream's duplicate window.
package jetstreamx

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/panicerr"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// Defaults for Options.
const (
	DefaultInProgressDelay = time.Second      // Nak delay of a message in progress in another consumer
	DefaultBatch           = 16               // messages Consume fetches at once
	DefaultMaxWait         = time.Second      // how long Consume waits for a message
	DefaultAckWait         = 30 * time.Second // JetStream's AckWait when the consumer's is not known
)

// Options configure a Handler. Group is required.
type Options struct {
	// Group is the consumerx group messages are deduplicated in, usually
	// the durable consumer's name. Within a Group, messages with one
	// Nats-Msg-Id are one message, on whatever stream they come from (a
	// mirror's or a source's copy is the message it copies): consumers of
	// streams whose publishers may reuse a Msg-Id for another message need
	// Groups of their own (say, stream + "/" + durable).
	Group string
	// Process configures deduplication. Key defaults to ID: the
	// Nats-Msg-Id header if the publisher set one, else
	// "<stream>:<stream sequence>" (a digest of the stream name when that
	// is too long for the guard). Message.Raw is the jetstream.Msg. A
	// sequence names a message only while its stream lives: a stream
	// deleted and made again starts at sequence 1, and for the guard's TTL
	// its messages without a Nats-Msg-Id would be taken for the old ones
	// (a Duplicate, never run, if the payload is the same; dead-lettered
	// with guard.ErrMismatch if not). Before making a stream again, give
	// its consumers a new Group, or have its publishers set Nats-Msg-Id.
	Process consumerx.Options
	// InProgressDelay is the NakWithDelay of a message another consumer is
	// running (at most until that consumer's lease ends; but Consume, for
	// a consumer with a MaxDeliver, Naks it until the lease ends, and at
	// least InProgressDelay: a holder that died must not make the message
	// spend its deliveries meanwhile), and, when RetryDelay is zero, of a
	// message that failed because the store refused (guard.ErrUnavailable):
	// each delivery counts toward the consumer's MaxDeliver. Default 1s.
	InProgressDelay time.Duration
	// RetryDelay is the NakWithDelay of a failed message. Zero: a plain
	// Nak, redelivered at once or by the consumer's BackOff (but see
	// InProgressDelay).
	RetryDelay time.Duration
	// InProgressEvery is how often a message not yet acknowledged is
	// reported in progress to the server (msg.InProgress), which restarts
	// its AckWait, while its handler, or the batch it came in, runs: so a
	// handler longer than AckWait is not redelivered while it runs.
	// Consume takes a third of the shortest time the server may wait for
	// an ack when it is zero: the consumer's AckWait, or with a BackOff
	// the smallest of its values (the server waits BackOff[n-1] for the
	// ack of a message's n-th delivery, and later values may be below the
	// first, which AckWait is), but at least MinInProgressEvery; and while
	// a batch runs it reads them again every second, so an AckWait lowered
	// on the durable meanwhile is kept from then on. Handle and HandleBatch
	// report nothing when it is zero: for a consumer with a BackOff, set it
	// to at most a third of the BackOff's smallest value. Negative: never.
	InProgressEvery time.Duration
	// Batch is how many messages Consume fetches and runs at once.
	// Default 16.
	Batch int
	// Concurrency is how many handlers of a batch run at once. Default 1:
	// one after another.
	Concurrency int
	// MaxWait is how long Consume waits for a message when none is ready,
	// and so about how long it takes to return after its context ends.
	// Default 1s.
	MaxWait time.Duration
	// MaxDeliver is the consumer's MaxDeliver, for Handle and HandleBatch,
	// which are given messages, not the consumer (Consume reads it from
	// the consumer's info and takes this one only when the info is not
	// known). On the last delivery it allows (the message's NumDelivered
	// has reached it) a message is never Nak'ed: the server would drop it.
	// One in progress elsewhere is waited for and run again once its
	// holder is done (a Duplicate if the holder completed it); one the
	// delivery did not complete (the store refused, the handler failed
	// with attempts left, the consumer stopped) is dead-lettered with a
	// cause matching ErrMaxDeliver and Term'ed (Process.OnOutcome then
	// hears the delivery twice: its first outcome, then DeadLettered).
	// While it waits for a holder the message is reported in progress as
	// while its handler runs (Handle: only with InProgressEvery set; if
	// not, the server may time the delivery out meanwhile and advise it
	// dropped, but this delivery still runs or dead-letters it). Zero or
	// negative: no limit known, every delivery is handled alike.
	MaxDeliver int
}

// Handler runs a consumerx.Handler for JetStream messages and acknowledges
// them as the outcome says: Ack for Processed, Duplicate and DeadLettered,
// Nak (with a delay) for InProgress and Failed, a plain Nak for
// Interrupted; but on the last delivery the consumer's MaxDeliver allows
// nothing is Nak'ed (see Options.MaxDeliver): a message the delivery did
// not complete is dead-lettered (ErrMaxDeliver) and Term'ed. A message whose handler returns an error after the context
// given to Handle (or Consume) ended is Interrupted: its claim is
// released, no attempt is counted, and the Nak hands it to another
// consumer at once. While a message waits for its acknowledgement the
// Handler reports it in progress every Options.InProgressEvery, so a long
// handler is not redelivered while it runs. Its messages must come from a
// consumer with AckPolicy AckExplicit (JetStream's default): with AckAll
// the Ack of a later message acknowledges one that failed, and with
// AckNone every message is acknowledged as delivered, so a failed message
// would never run again nor be dead-lettered (Consume refuses such a
// consumer). Safe for concurrent use.
type Handler struct {
	g    *guard.Guard
	proc *consumerx.Processor
	h    consumerx.Handler
	opts Options
}

// batchFunc runs a batch and reports each message's outcome: Consume's
// and HandleBatch's is Handler.guarded (a benchmark passes the bare
// handler to consume).
type batchFunc func(ctx context.Context, msgs []consumerx.Message) []consumerx.BatchResult

// New returns a Handler that runs h once per (Group, message id) under g.
func New(g *guard.Guard, h consumerx.Handler, opts Options) (*Handler, error) {
	switch {
	case h == nil:
		return nil, errors.New("jetstreamx: nil handler")
	case opts.Group == "":
		return nil, errors.New("jetstreamx: Options.Group is required")
	case opts.InProgressDelay < 0, opts.RetryDelay < 0, opts.MaxWait < 0:
		return nil, errors.New("jetstreamx: negative delay")
	case opts.Batch < 0, opts.Concurrency < 0:
		return nil, errors.New("jetstreamx: negative Batch or Concurrency")
	}
	if opts.InProgressDelay == 0 {
		opts.InProgressDelay = DefaultInProgressDelay
	}
	if opts.Batch == 0 {
		opts.Batch = DefaultBatch
	}
	if opts.MaxWait == 0 {
		opts.MaxWait = DefaultMaxWait
	}
	p, err := consumerx.NewProcessor(g, opts.Group, opts.Process)
	if err != nil {
		return nil, fmt.Errorf("jetstreamx: %w", err)
	}
	return &Handler{g: g, proc: p, h: h, opts: opts}, nil
}

// guarded runs a batch through the processor: their claims in one round
// trip, their completions in another, up to Options.Concurrency handlers
// at once.
func (h *Handler) guarded(ctx context.Context, msgs []consumerx.Message) []consumerx.BatchResult {
	return h.proc.ProcessBatch(ctx, msgs, h.h, consumerx.BatchOptions{Concurrency: h.opts.Concurrency})
}

// Processor returns the consumerx.Processor messages run through.
func (h *Handler) Processor() *consumerx.Processor { return h.proc }

// ID returns the default id of msg: its Nats-Msg-Id header, or
// "<stream>:<stream sequence>", or, when that is longer than
// guard.MaxIDLen (a stream name near JetStream's 255 characters),
// "sha256.<digest of the stream name>:<stream sequence>" (the digest in
// unpadded base64url). A Nats-Msg-Id the guard cannot store (longer than
// guard.MaxIDLen, control characters, invalid UTF-8) is
// "nats-msg-id.sha256:<digest of it>". A stream name holds no '.', so the
// forms made here never meet, and every message has an id the guard can
// store. A Nats-Msg-Id a publisher sets is used as it is, though: one of
// the form "<stream>:<sequence>" ("ORDERS:7") is the id of that stream's
// message at that sequence if it has none (found a Duplicate of it, or
// dead-lettered with guard.ErrMismatch): where some publishers of a
// stream set no Nats-Msg-Id, the others' must not take that form.
func ID(msg jetstream.Msg) string {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		if (guard.Key{Scope: "s", ID: id}).Validate() != nil {
			sum := sha256.Sum256([]byte(id))
			return "nats-msg-id.sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
		}
		return id
	}
	md, err := msg.Metadata()
	if err != nil {
		return ""
	}
	seq := ":" + strconv.FormatUint(md.Sequence.Stream, 10)
	if len(md.Stream)+len(seq) <= guard.MaxIDLen {
		return md.Stream + seq
	}
	sum := sha256.Sum256([]byte(md.Stream))
	return "sha256." + base64.RawURLEncoding.EncodeToString(sum[:]) + seq
}

// Handle runs one message and acknowledges it. It returns the outcome and,
// if the acknowledgement could not be sent, that error (the message then
// comes back and is recognised). With Options.InProgressEvery set, the
// message is reported in progress that often while its handler runs.
//
// A handler's panic does not go on (nats.go would not recover it, and a
// message that always panics would take the process down on every
// delivery): as in HandleBatch and Consume, it is a failed attempt of the
// message, which is Failed with an error matching guard.ErrPanicked
// (errors.As gives the *guard.PanicError with the value and the stack)
// and Nak'ed, and dead-lettered once its attempts run out. A handler that
// panics after ctx ended is Interrupted, as one that returns an error
// then is. runtime.Goexit is not a panic: it goes on, the claim is
// released and the message, not acknowledged, comes back after AckWait.
func (h *Handler) Handle(ctx context.Context, msg jetstream.Msg) (consumerx.Outcome, error) {
	cmsg := message(msg)
	stop := h.keepInProgress([]jetstream.Msg{msg}, h.opts.InProgressEvery, nil)
	o, err := func() (consumerx.Outcome, error) {
		// Stopped also when the handler calls runtime.Goexit: a message
		// reported in progress for ever is never redelivered.
		defer stop()
		o, err := h.proc.Process(ctx, cmsg, h.recovering)
		return h.settleLastOf(ctx, msg, cmsg, o, err, h.opts.MaxDeliver)
	}()
	return o, h.acknowledge(msg, cmsg.ID, o, err, false)
}

// recovering runs the handler, its panic made a failure of the run (a
// *panicerr.Error), counted as an attempt as in consumerx.Processor.ProcessBatch.
func (h *Handler) recovering(ctx context.Context, msg consumerx.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			lease, _ := consumerx.LeaseFrom(ctx)
			err = panicerr.New(lease.Key, v)
		}
	}()
	return h.h(ctx, msg)
}

func message(msg jetstream.Msg) consumerx.Message {
	return consumerx.Message{ID: ID(msg), Payload: msg.Data(), Metadata: metadata(msg.Headers()), Raw: msg}
}

// acknowledge tells the server what became of msg. untilLease: the
// consumer has a MaxDeliver (see Consume).
func (h *Handler) acknowledge(msg jetstream.Msg, id string, o consumerx.Outcome, err error, untilLease bool) error {
	var aerr error
	switch o {
	case consumerx.DeadLettered:
		if errors.Is(err, ErrMaxDeliver) {
			// Dead-lettered on its last delivery (settleLast): Term says
			// the message was not processed, in the server's
			// MSG_TERMINATED advisory, and stops it as an Ack does.
			aerr = msg.TermWithReason(termReason)
		} else {
			aerr = msg.Ack()
		}
	case consumerx.Processed, consumerx.Duplicate:
		aerr = msg.Ack()
	case consumerx.InProgress:
		delay := h.opts.InProgressDelay
		var ip *guard.InProgressError
		switch {
		case !errors.As(err, &ip):
		case untilLease:
			// Until the holder's lease ends: Nak'ed every
			// InProgressDelay, a message whose holder died would spend
			// the consumer's MaxDeliver for the rest of that lease and
			// be dropped.
			delay = max(delay, ip.RetryAfter)
		case ip.RetryAfter > 0:
			delay = min(delay, ip.RetryAfter)
		}
		aerr = msg.NakWithDelay(delay)
	case consumerx.Interrupted:
		aerr = msg.Nak() // this consumer is stopping: let another take it now
	default:
		switch {
		case h.opts.RetryDelay > 0:
			aerr = msg.NakWithDelay(h.opts.RetryDelay)
		case errors.Is(err, guard.ErrUnavailable):
			// The store refused: redelivered at once, the message would
			// spend the consumer's MaxDeliver in a tight loop for as long
			// as the outage lasts, and then be dropped by the server.
			aerr = msg.NakWithDelay(h.opts.InProgressDelay)
		default:
			aerr = msg.Nak()
		}
	}
	if aerr != nil {
		return fmt.Errorf("jetstreamx: acknowledge %s as %s: %w", id, o, aerr)
	}
	return nil
}

// keepInProgress reports msgs in progress every d until stop is called
// (stop waits for a report under way, and ends and waits for a look at
// the pace; calling it again does nothing); d ≤ 0: never. With pace
// (Consume's), d is what pace says: at a tick ackRefresh or more after
// the last look it is looked up again, on a goroutine of its own, after
// the reports due by the d already known, so that a slow or lost reply
// (up to ackRefresh) holds no report back; ticks come every ackRefresh at
// most (or every d, if shorter), and a report comes when the next tick
// would be too late for d. A d lowered on the server is kept from the
// answer that tells of it: a report then if one is due by it, and ticks
// at its step from then.
func (h *Handler) keepInProgress(msgs []jetstream.Msg, d time.Duration, pace *ackPace) (stop func()) {
	if d <= 0 {
		return func() {}
	}
	step := func(d time.Duration) time.Duration {
		if pace == nil {
			return d
		}
		return min(d, ackRefresh)
	}
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
		last    = time.Now() // the last report, or the delivery
		looks   sync.WaitGroup
	)
	lookCtx, endLook := context.WithCancel(context.Background())
	// report sends the reports due by d, and sets the next tick. Under mu.
	report := func() {
		now := time.Now()
		if now.Sub(last) >= d-step(d) {
			for _, m := range msgs {
				_ = m.InProgress() // a lost report: the message may come back, and is recognised
			}
			last = now
		}
		t.Reset(step(d))
	}
	tick := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		report()
		if pace == nil || !pace.due() {
			return
		}
		// Asked off the ticks: a reply that is slow or lost (up to
		// ackRefresh) must not hold back the reports meanwhile.
		looks.Add(1)
		go func() {
			defer looks.Done()
			nd := pace.look(lookCtx)
			mu.Lock()
			defer mu.Unlock()
			if stopped || nd <= 0 || nd == d {
				return
			}
			d = nd
			report()
		}()
	}
	mu.Lock()
	t = time.AfterFunc(step(d), tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		endLook() // no request outlives stop
		looks.Wait()
	}
}

// HandleBatch runs msgs as one batch (consumerx.Processor.ProcessBatch:
// their claims in one round trip, their completions in another, up to
// Options.Concurrency handlers at once), reporting every message in
// progress every Options.InProgressEvery until the batch is done, then
// acknowledges each as Handle does. It returns each message's outcome and
// the first acknowledgement that could not be sent. A handler that calls
// runtime.Goexit in a batch run one message at a time ends the caller's
// goroutine inside the batch (consumerx.Processor.ProcessBatch): the
// in-progress reports stop, nothing is acknowledged, and the batch's
// messages come back after AckWait.
func (h *Handler) HandleBatch(ctx context.Context, msgs []jetstream.Msg) ([]consumerx.Outcome, error) {
	return h.handleBatch(ctx, msgs, h.opts.InProgressEvery, nil, h.guarded, false, func() int { return h.opts.MaxDeliver })
}

// handleBatch is HandleBatch with the messages run by batch, reported in
// progress every every (as pace says, if not nil: see keepInProgress).
// maxDeliver gives the consumer's MaxDeliver (see Options.MaxDeliver),
// asked for only when a message is not acknowledged. consume: for
// Consume, whose messages in progress elsewhere are Nak'ed until the
// holder's lease ends on a consumer with a MaxDeliver (as maxDeliver says
// at the time: it may be set while Consume runs).
func (h *Handler) handleBatch(ctx context.Context, msgs []jetstream.Msg, every time.Duration, pace *ackPace, batch batchFunc, consume bool, maxDeliver func() int) ([]consumerx.Outcome, error) {
	cmsgs := make([]consumerx.Message, len(msgs))
	for i, m := range msgs {
		cmsgs[i] = message(m)
	}
	stop := h.keepInProgress(msgs, every, pace)
	// Stopped also when a handler run on this goroutine (Concurrency 1)
	// calls runtime.Goexit, which ends it inside batch: messages reported
	// in progress for ever are never redelivered.
	defer stop()
	res := batch(ctx, cmsgs)
	for i := range res {
		// Reported in progress meanwhile: a message on its last delivery
		// may wait for its holder.
		res[i].Outcome, res[i].Err = h.settleLast(ctx, msgs[i], cmsgs[i], res[i].Outcome, res[i].Err, maxDeliver)
	}
	stop()
	outs := make([]consumerx.Outcome, len(msgs))
	var first error
	for i, r := range res {
		outs[i] = r.Outcome
		// Until the holder's lease ends on a consumer with a MaxDeliver,
		// as the server has it now: it may be set while Consume runs.
		untilLease := consume && r.Outcome == consumerx.InProgress && maxDeliver() > 0
		if err := h.acknowledge(msgs[i], cmsgs[i].ID, r.Outcome, r.Err, untilLease); err != nil && first == nil {
			first = err
		}
	}
	return outs, first
}

// Consume fetches cons's messages in batches of up to Options.Batch and
// runs each batch through HandleBatch, until ctx is cancelled; then it
// returns nil once the batch under way is done. It returns an error
// when the consumer or its stream is found deleted, or the connection
// closed; a pull the server refuses for a while (more pulls waiting than
// the consumer's MaxWaiting, a leader change, JetStream unavailable) is
// sent again after Options.MaxWait/10 (twice as long each time it is
// refused again, up to MaxWait), with a log at Warn level. It asks for at
// most the consumer's MaxRequestBatch messages at once and waits at most
// its MaxRequestExpires. It takes the messages
// that are ready at once (FetchNoWait); when none is, it waits up to
// Options.MaxWait for the next. Messages are reported in progress every
// Options.InProgressEvery, or a third of the consumer's AckWait (of the
// smallest value of its BackOff, if that is shorter; at least
// MinInProgressEvery; read again every second while a batch runs, so that
// a durable edited meanwhile is followed), until acknowledged. A handler running when ctx ends sees its context
// cancelled; if it then returns an error the message is Interrupted
// (released and Nak'ed, no attempt counted), and the messages of the batch
// whose turn had not come are Interrupted without running.
//
// Consume refuses, before it fetches anything, a consumer whose
// AckPolicy is not AckExplicit (see Handler), and one whose
// MaxDeliver would stop redelivering a failing message before its
// attempts (Process.MaxAttempts) ran out: the attempts would mean nothing,
// the message being dead-lettered at MaxDeliver instead. MaxDeliver counts every delivery,
// including the Naks of a message in progress in another consumer (with a
// MaxDeliver set, such a message is Nak'ed until the holder's lease ends,
// so a holder that died costs it a delivery or two, not one every
// InProgressDelay) and of one the store refused: leave it unlimited (-1,
// JetStream's default), or well above MaxAttempts. On the last delivery
// MaxDeliver allows, a message is not Nak'ed but waited for or
// dead-lettered (see Options.MaxDeliver, which Consume takes only when the
// consumer's info is not known). The durable's MaxDeliver may be edited
// while Consume runs: before it Naks a batch's first message it asks the
// server for the one in force (the handle's cached info would have it Nak
// a message on a last delivery lowered since, which the server drops).
func (h *Handler) Consume(ctx context.Context, cons jetstream.Consumer) error {
	return h.consume(ctx, cons, h.guarded)
}

// consume is Consume with each batch run by run.
func (h *Handler) consume(ctx context.Context, cons jetstream.Consumer, run batchFunc) error {
	info := cons.CachedInfo()
	maxDeliver := h.opts.MaxDeliver
	if info != nil {
		maxDeliver = info.Config.MaxDeliver
		if p := info.Config.AckPolicy; p != jetstream.AckExplicitPolicy {
			return fmt.Errorf("jetstreamx: consumer %q has AckPolicy %s: a failed message would be acknowledged (by a later message's Ack, or when delivered) and never run again; use AckExplicit",
				info.Name, p)
		}
	}
	if maxDeliver > 0 {
		if limit := h.proc.MaxAttempts(); limit == 0 || maxDeliver <= limit {
			attempts := "no limit on attempts"
			if limit > 0 {
				attempts = fmt.Sprintf("%d attempts", limit)
			}
			name := ""
			if info != nil {
				name = info.Name
			}
			return fmt.Errorf("jetstreamx: consumer %q has MaxDeliver %d, at most %s: a failing message would be dead-lettered at MaxDeliver before its attempts ran out; set MaxDeliver to -1 or above the attempts",
				name, maxDeliver, attempts)
		}
	}
	// The durable's MaxDeliver may be edited while it runs: lowered, a
	// message Nak'ed on what was not its last delivery by the info cached
	// would be dropped by the server; set, a message whose holder died
	// must be Nak'ed until the holder's lease ends. Asked again before a
	// batch's first Nak.
	live := &liveMaxDeliver{last: maxDeliver}
	if info != nil {
		live.cons = cons
	}
	// The in-progress pace: the caller's, or the consumer's as the
	// server has it, asked again while a batch runs (the durable's
	// AckWait and BackOff may be edited while Consume runs).
	every := h.opts.InProgressEvery
	var pace *ackPace
	if every == 0 {
		every = DefaultAckWait / 3
		if info != nil {
			if w := inProgressEvery(info.Config); w > 0 {
				every = w
			}
			pace = &ackPace{cons: cons, every: every, asked: time.Now()}
		}
	}
	// Pulls within the consumer's limits: the server refuses one asking
	// for more messages, or waiting longer, than it allows.
	n, maxWait := h.opts.Batch, h.opts.MaxWait
	if info != nil {
		if m := info.Config.MaxRequestBatch; m > 0 && n > m {
			n = m
		}
		if e := info.Config.MaxRequestExpires; e > 0 && maxWait > e {
			maxWait = e
		}
	}
	log := h.opts.Process.Logger
	if log == nil {
		log = slog.Default()
	}
	msgs := make([]jetstream.Msg, 0, n)
	var pause time.Duration // after a refused pull
	for ctx.Err() == nil {
		msgs = msgs[:0]
		var err error
		msgs, err = pull(ctx, cons, msgs, n, maxWait)
		if len(msgs) > 0 {
			if pace != nil {
				every = pace.last()
			}
			if _, err := h.handleBatch(ctx, msgs, every, pace, run, true, live.batch(ctx)); err != nil {
				// Nothing else hears of it: the message comes back after
				// AckWait (a Duplicate if it completed), and an operator
				// sees why.
				log.WarnContext(ctx, "jetstreamx: acknowledgement not sent (the batch's first); the message comes back after AckWait", "err", err)
			}
		}
		if err == nil {
			pause = 0
			continue
		}
		if ctx.Err() != nil {
			break
		}
		if err := gone(ctx, cons, err); err != nil {
			return fmt.Errorf("jetstreamx: fetch: %w", err)
		}
		// One that may pass: tried again after a pause, longer each time.
		pause = min(max(2*pause, h.opts.MaxWait/10), h.opts.MaxWait)
		log.WarnContext(ctx, "jetstreamx: pull refused; trying again", "err", err, "pause", pause)
		wait.For(ctx, pause)
	}
	return nil
}

// MinInProgressEvery is the floor of the pace at which Consume, left to
// choose it (Options.InProgressEvery zero), reports a running message in
// progress. Without it a BackOff value of 1 ms had it report every
// 333 µs: a message to the server per message of the batch each time,
// thousands a second, for an ack wait that reports cannot keep anyway
// (a report's own trip to the server and a timer's lateness under load
// are of that order). 100 ms keeps them to 10 a second a message; it is
// also how long the server itself waits before it looks at its pending
// messages again after AckWait is changed. A consumer whose AckWait, or a
// value of its BackOff, is below 300 ms has its handlers that outlive it
// redelivered while they run (recognised as in progress elsewhere, not
// run twice). An Options.InProgressEvery set explicitly is used as given.
const MinInProgressEvery = 100 * time.Millisecond

// ackRefresh is how often, at most, Consume asks the server for the
// consumer's AckWait and BackOff while a batch runs: an AckWait lowered
// while a handler runs is kept at most this long after the change (until
// then the reports keep the old pace, and a message whose last report is
// older than the new AckWait is redelivered meanwhile: recognised as in
// progress, not run twice). It is asked at a batch's in-progress ticks
// only, after their reports and apart from them (a slow or lost reply
// holds no report back): a batch done before its first tick asks
// nothing.
const ackRefresh = time.Second

// ackPace is Consume's in-progress pace: a third of the shortest ack
// wait of the consumer's config as last read (inProgressEvery), read
// again at most every ackRefresh.
type ackPace struct {
	cons  jetstream.Consumer
	mu    sync.Mutex
	every time.Duration
	asked time.Time
}

// last returns the pace as last read.
func (a *ackPace) last() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.every
}

// due reports whether the pace is to be read again from the server (it
// was read ackRefresh ago or more), and if so counts it read now: a
// look starts ackRefresh after the last at the earliest.
func (a *ackPace) due() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Since(a.asked) < ackRefresh {
		return false
	}
	a.asked = time.Now()
	return true
}

// look returns the pace read again from the server, waiting at most
// until ctx ends or ackRefresh passed (the last one known if the server
// does not answer by then).
func (a *ackPace) look(ctx context.Context) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, min(infoTimeout, ackRefresh))
	defer cancel()
	info, err := a.cons.Info(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil {
		if w := inProgressEvery(info.Config); w > 0 {
			a.every = w
		}
	}
	return a.every
}

// inProgressEvery is the in-progress pace Consume takes for cfg: a third
// of shortestAckWait, at least MinInProgressEvery; 0 if cfg says no ack
// wait.
func inProgressEvery(cfg jetstream.ConsumerConfig) time.Duration {
	w := shortestAckWait(cfg)
	if w <= 0 {
		return 0
	}
	return max(w/3, MinInProgressEvery)
}

// shortestAckWait is the shortest time the server may wait for the ack of
// one of cfg's deliveries (0 if cfg says none): its AckWait, or, with a
// BackOff, the smallest of its values, since the server waits BackOff[n-1]
// (its last value past its end) for the ack of a message's n-th delivery
// and sets AckWait to BackOff[0], which later values may be below.
func shortestAckWait(cfg jetstream.ConsumerConfig) time.Duration {
	w := cfg.AckWait
	for _, b := range cfg.BackOff {
		if b > 0 && (w <= 0 || b < w) {
			w = b
		}
	}
	return w
}

// pull appends to msgs up to n of cons's messages: those ready at once,
// or, when none is, the first to come within maxWait and those ready with
// it. Its error is a pull's, or one the server answered a pull with
// (nats.go gives that in the batch: a 409 for too many waiting pulls, a
// deleted consumer, a leader change; no responders once the consumer is
// gone); maxWait running out with no message is not one.
//
// The wait is the server's (FetchMaxWait: it ends the pull with a 408
// after maxWait, and nats.go waits a second longer for that), not a
// context's: with FetchContext nats.go stops listening when the context
// ends, a tenth of the wait (at most 1 s) after the server's expiry, and
// a message the server sends in between, or late on a loaded machine, is
// dropped by the client and redelivered only after AckWait (30 s by
// default; TestMessageAtPullExpiryNotLost). So ctx ending does not cut
// the wait short: Consume returns up to maxWait later, and a message
// that comes meanwhile is Interrupted and Nak'ed, not lost; nothing more
// is pulled with it then.
func pull(ctx context.Context, cons jetstream.Consumer, msgs []jetstream.Msg, n int, maxWait time.Duration) ([]jetstream.Msg, error) {
	batch, err := cons.FetchNoWait(n)
	if err != nil {
		return msgs, err
	}
	if msgs, err = collect(msgs, batch); err != nil || len(msgs) > 0 || ctx.Err() != nil {
		return msgs, err
	}
	// Nothing ready: wait for the next message, then take what else is
	// ready with it.
	if batch, err = cons.Fetch(1, jetstream.FetchMaxWait(maxWait)); err != nil {
		return msgs, err
	}
	if msgs, err = collect(msgs, batch); err != nil {
		return msgs, err
	}
	// Not once ctx has ended: the message that came during the wait is
	// Interrupted (and Nak'ed); more pulled now would only be Interrupted
	// too, each spending a delivery (one on its last, dead-lettered
	// unrun), where they are left for the next consumer to run.
	if len(msgs) > 0 && n > 1 && ctx.Err() == nil {
		if more, err := cons.FetchNoWait(n - 1); err == nil {
			msgs, _ = collect(msgs, more) // its error shows on the next pull
		}
	}
	return msgs, nil
}

// gone returns err, a pull's error, if it says that cons or its stream is
// no more (deleted, or the connection closed) and nil if it may pass. No
// responders, which a pull of a deleted consumer gets, is also what
// JetStream answers while it is unavailable: the consumer's info tells
// which.
func gone(ctx context.Context, cons jetstream.Consumer, err error) error {
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, nats.ErrConnectionClosed) {
		return err
	}
	if !errors.Is(err, nats.ErrNoResponders) {
		return nil
	}
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, ierr := cons.Info(ictx); errors.Is(ierr, jetstream.ErrConsumerNotFound) || errors.Is(ierr, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: %w", err, ierr)
	}
	return nil
}

// collect appends the messages of batch, waiting until it ends, and
// returns the error the batch ended with.
func collect(msgs []jetstream.Msg, batch jetstream.MessageBatch) ([]jetstream.Msg, error) {
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	return msgs, batch.Error()
}

func metadata(h nats.Header) map[string]string {
	if len(h) == 0 {
		return nil
	}
	m := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			m[k] = v[0]
		}
	}
	return m
}
