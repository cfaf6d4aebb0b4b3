// Package jetstreamx runs a NATS JetStream consumer's messages once per
// group, however often JetStream delivers them (redeliveries after a Nak,
// an expired AckWait or a lost ack) and however often a publisher sent the
// same message outside the stream's duplicate window.
package jetstreamx

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// DefaultInProgressDelay is the Nak delay of a message that is in progress
// in another consumer.
const DefaultInProgressDelay = time.Second

// Options configure a Handler. Group is required.
type Options struct {
	// Group is the consumerx group messages are deduplicated in, usually
	// the durable consumer's name.
	Group string
	// Process configures deduplication. Key defaults to ID: the
	// Nats-Msg-Id header if the publisher set one, else
	// "<stream>:<stream sequence>". Message.Raw is the jetstream.Msg.
	Process consumerx.Options
	// InProgressDelay is the NakWithDelay of a message another consumer is
	// running (at most until that consumer's lease ends). Default 1s.
	InProgressDelay time.Duration
	// RetryDelay is the NakWithDelay of a failed message. Zero: a plain
	// Nak, redelivered at once or by the consumer's BackOff.
	RetryDelay time.Duration
}

// Handler runs a consumerx.Handler for JetStream messages and acknowledges
// them as the outcome says: Ack for Processed, Duplicate and DeadLettered,
// Nak (with a delay) for InProgress and Failed, a plain Nak for
// Interrupted. A message whose handler returns an error after the context
// given to Handle (or Consume) ended is Interrupted: its claim is
// released, no attempt is counted, and the Nak hands it to another
// consumer at once. Keep the consumer's
// AckWait above the longest handler run, or the message is redelivered
// while it runs (and Nak'ed as InProgress). Safe for concurrent use.
type Handler struct {
	proc *consumerx.Processor
	h    consumerx.Handler
	opts Options
}

// New returns a Handler that runs h once per (Group, message id) under g.
func New(g *guard.Guard, h consumerx.Handler, opts Options) (*Handler, error) {
	switch {
	case h == nil:
		return nil, errors.New("jetstreamx: nil handler")
	case opts.Group == "":
		return nil, errors.New("jetstreamx: Options.Group is required")
	case opts.InProgressDelay < 0, opts.RetryDelay < 0:
		return nil, errors.New("jetstreamx: negative delay")
	}
	if opts.InProgressDelay == 0 {
		opts.InProgressDelay = DefaultInProgressDelay
	}
	p, err := consumerx.NewProcessor(g, opts.Group, opts.Process)
	if err != nil {
		return nil, fmt.Errorf("jetstreamx: %w", err)
	}
	return &Handler{proc: p, h: h, opts: opts}, nil
}

// Processor returns the consumerx.Processor messages run through.
func (h *Handler) Processor() *consumerx.Processor { return h.proc }

// ID returns the default id of msg: its Nats-Msg-Id header, or
// "<stream>:<stream sequence>".
func ID(msg jetstream.Msg) string {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id
	}
	md, err := msg.Metadata()
	if err != nil {
		return ""
	}
	return md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
}

// Handle runs one message and acknowledges it. It returns the outcome and,
// if the acknowledgement could not be sent, that error (the message then
// comes back and is recognised).
func (h *Handler) Handle(ctx context.Context, msg jetstream.Msg) (consumerx.Outcome, error) {
	cmsg := consumerx.Message{ID: ID(msg), Payload: msg.Data(), Metadata: metadata(msg.Headers()), Raw: msg}
	o, err := h.proc.Process(ctx, cmsg, h.h)
	var aerr error
	switch o {
	case consumerx.Processed, consumerx.Duplicate, consumerx.DeadLettered:
		aerr = msg.Ack()
	case consumerx.InProgress:
		delay := h.opts.InProgressDelay
		var ip *guard.InProgressError
		if errors.As(err, &ip) && ip.RetryAfter > 0 {
			delay = min(delay, ip.RetryAfter)
		}
		aerr = msg.NakWithDelay(delay)
	case consumerx.Interrupted:
		aerr = msg.Nak() // this consumer is stopping: let another take it now
	default:
		if h.opts.RetryDelay > 0 {
			aerr = msg.NakWithDelay(h.opts.RetryDelay)
		} else {
			aerr = msg.Nak()
		}
	}
	if aerr != nil {
		return o, fmt.Errorf("jetstreamx: acknowledge %s as %s: %w", cmsg.ID, o, aerr)
	}
	return o, nil
}

// Consume runs cons's messages through the Handler until ctx is cancelled,
// then stops the subscription and returns once no handler is running. A
// handler running when ctx ends sees its context cancelled; if it then
// returns an error the message is Interrupted (released and Nak'ed, no
// attempt counted). A message received after the stop is left
// unacknowledged, for redelivery.
func (h *Handler) Consume(ctx context.Context, cons jetstream.Consumer, opts ...jetstream.PullConsumeOpt) error {
	var (
		mu      sync.Mutex
		stopped bool
		running sync.WaitGroup
	)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		running.Add(1)
		mu.Unlock()
		defer running.Done()
		_, _ = h.Handle(ctx, msg)
	}, opts...)
	if err != nil {
		return fmt.Errorf("jetstreamx: consume: %w", err)
	}
	<-ctx.Done()
	cc.Stop()
	<-cc.Closed()
	mu.Lock()
	stopped = true
	mu.Unlock()
	running.Wait()
	return nil
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
