package jetstreamx

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// ErrMaxDeliver is the cause of dead-lettering a message on the last
// delivery the consumer's MaxDeliver allows, when that delivery did not
// complete it: the store refused its claim, its handler failed with
// attempts left, the consumer stopped while it ran, or it was still in
// progress elsewhere when the consumer stopped; or its handler succeeded
// but the store refused to record it (the cause says so: the effect may
// have happened). The cause given to
// Options.Process.DeadLetter matches ErrMaxDeliver and the delivery's own
// error (guard.ErrUnavailable, the handler's error, …). JetStream drops a
// message whose deliveries ran out, with nothing but an advisory
// ($JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES): dead-lettered instead, it
// is not lost.
var ErrMaxDeliver = errors.New("jetstreamx: the consumer's MaxDeliver was reached")

// maxDeliverError is the dead-letter cause of a message whose last
// delivery did not complete it.
type maxDeliverError struct {
	delivered  uint64
	maxDeliver int
	err        error // the delivery's own
}

func (e *maxDeliverError) Error() string {
	return fmt.Sprintf("jetstreamx: delivery %d of MaxDeliver %d did not complete the message: %v",
		e.delivered, e.maxDeliver, e.err)
}

func (e *maxDeliverError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrMaxDeliver}
	}
	return []error{ErrMaxDeliver, e.err}
}

// liveMaxDeliver returns a function giving cons's MaxDeliver as the
// server has it now (the durable's may have been edited since cached was
// read), asked at most once per call of the function returned by its
// batch method; when the server does not answer, the last one known.
// A nil cons (its info never known: Options.MaxDeliver) is not asked.
type liveMaxDeliver struct {
	cons jetstream.Consumer
	last int
}

// infoTimeout bounds the request for a consumer's info.
const infoTimeout = 2 * time.Second

// batch returns the MaxDeliver for one batch's messages: asked of the
// server the first time it is called.
func (l *liveMaxDeliver) batch(ctx context.Context) func() int {
	asked := false
	return func() int {
		if asked || l.cons == nil {
			return l.last
		}
		asked = true
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), infoTimeout)
		defer cancel()
		if info, err := l.cons.Info(ictx); err == nil {
			l.last = info.Config.MaxDeliver
		}
		return l.last
	}
}

// termReason is the reason of the Term of a message dead-lettered at
// MaxDeliver, in the server's $JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.
const termReason = "idemguard: dead-lettered at MaxDeliver"

// settleLast makes sure msg's delivery, whose outcome was o (err), is not
// Nak'ed when it is the last one maxDeliver allows (the server would drop
// the message): a message in progress elsewhere is waited for (its
// in-progress reports go on meanwhile) and run again once the holder is
// done, so that the holder's completion stands (Duplicate) and a holder
// that failed or died does not lose it; a message that the delivery did
// not complete is dead-lettered with a cause matching ErrMaxDeliver
// (acknowledge then Terms it). Any other delivery's outcome is returned
// unchanged. maxDeliver is asked only for a delivery not acknowledged.
func (h *Handler) settleLast(ctx context.Context, msg jetstream.Msg, cmsg consumerx.Message, o consumerx.Outcome, err error, maxDeliver func() int) (consumerx.Outcome, error) {
	if o.Ack() {
		return o, err
	}
	return h.settleLastOf(ctx, msg, cmsg, o, err, maxDeliver())
}

// settleLastOf is settleLast once the consumer's MaxDeliver is known.
func (h *Handler) settleLastOf(ctx context.Context, msg jetstream.Msg, cmsg consumerx.Message, o consumerx.Outcome, err error, maxDeliver int) (consumerx.Outcome, error) {
	if maxDeliver <= 0 {
		return o, err
	}
	md, merr := msg.Metadata()
	if merr != nil || md.NumDelivered < uint64(maxDeliver) {
		return o, err
	}
	for o == consumerx.InProgress && ctx.Err() == nil {
		d := h.opts.InProgressDelay
		if ip, ok := errors.AsType[*guard.InProgressError](err); ok && ip.RetryAfter > 0 {
			d = min(d, ip.RetryAfter)
		}
		if !wait.For(ctx, d) {
			break
		}
		o, err = h.proc.Process(ctx, cmsg, h.recovering)
	}
	if o.Ack() {
		return o, err
	}
	return h.deadLetterLast(ctx, cmsg, &maxDeliverError{delivered: md.NumDelivered, maxDeliver: maxDeliver, err: err})
}

// deadLetterLast hands msg, on its last delivery, to
// Options.Process.DeadLetter with cause, once: no further delivery would
// try again. It does not ask the store (a store that is down may be why
// the deliveries ran out), so the call has no dead-letter record of its
// own (consumerx.LeaseFrom finds none). Its context outlives ctx (the
// consumer may be stopping) by up to the guard's lease, at least a second.
func (h *Handler) deadLetterLast(ctx context.Context, msg consumerx.Message, cause error) (consumerx.Outcome, error) {
	log := h.opts.Process.Logger
	if log == nil {
		log = slog.Default()
	}
	log = log.With("group", h.opts.Group)
	if h.opts.Process.DeadLetter == nil {
		log.ErrorContext(ctx, "jetstreamx: message dead-lettered at MaxDeliver (no DeadLetter set: dropped)", "id", msg.ID, "cause", cause)
		h.heard(ctx, log, msg, consumerx.DeadLettered, cause)
		return consumerx.DeadLettered, cause
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(h.g.Options().Lease, time.Second))
	defer cancel()
	if err := sendDeadLetter(dctx, h.opts.Process.DeadLetter, msg, cause); err != nil {
		log.ErrorContext(ctx, "jetstreamx: message at MaxDeliver not dead-lettered: the server drops it", "id", msg.ID, "cause", cause, "err", err)
		return consumerx.Failed, fmt.Errorf("jetstreamx: dead letter of %s: %w (%w)", msg.ID, err, cause)
	}
	log.ErrorContext(ctx, "jetstreamx: message dead-lettered at MaxDeliver", "id", msg.ID, "cause", cause)
	h.heard(ctx, log, msg, consumerx.DeadLettered, cause)
	return consumerx.DeadLettered, cause
}

// sendDeadLetter calls dl, its panic made an error matching
// guard.ErrPanicked.
func sendDeadLetter(ctx context.Context, dl func(context.Context, consumerx.Message, error) error, msg consumerx.Message, cause error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("dead letter panicked: %w", &guard.PanicError{Value: v, Stack: debug.Stack()})
		}
	}()
	return dl(ctx, msg, cause)
}

// heard tells Options.Process.OnOutcome the outcome settleLast gave a
// delivery the processor had reported otherwise; a panic of it goes no
// further, as in consumerx.
func (h *Handler) heard(ctx context.Context, log *slog.Logger, msg consumerx.Message, o consumerx.Outcome, err error) {
	f := h.opts.Process.OnOutcome
	if f == nil {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			log.ErrorContext(ctx, "jetstreamx: OnOutcome panicked", "id", msg.ID, "value", v)
		}
	}()
	f(ctx, msg, o, err)
}
