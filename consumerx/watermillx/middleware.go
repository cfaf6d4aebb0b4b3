// Package watermillx is a Watermill router middleware that runs each
// message's handler once per handler (or group), however often the
// message is delivered.
//
// Unlike Watermill's own Deduplicator, which marks a message seen before
// the handler runs, a message is recorded done only when its handler
// succeeded: a failed handler's message is nacked and runs again (up to the
// attempt limit, then it is dead-lettered). The messages a handler produced
// are stored with the record and returned again for every duplicate, with
// their original UUIDs, so a publish that failed after the handler
// succeeded is repeated rather than lost, and downstream consumers can
// deduplicate them in turn.
package watermillx

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/panicerr"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/wait"
)

// DefaultInProgressDelay is how long a message that is in progress in
// another consumer is held before it is nacked for redelivery.
const DefaultInProgressDelay = time.Second

// Options configure a Middleware. The zero value is ready to use.
type Options struct {
	// Group is the consumer group messages are deduplicated in. Default:
	// the name of the router handler (message.HandlerNameFromCtx), so each
	// handler runs each message once even when the middleware is added to
	// the whole router.
	Group string
	// Process configures deduplication. Its Key defaults to ID: the
	// message UUID (consumerx.Message.ID), or its digest when the guard
	// cannot store it; a message without a UUID has none (see ID: set Key
	// where messages may come without one). Message.Raw is the
	// *message.Message.
	Process consumerx.Options
	// InProgressDelay is how long a message held by another consumer waits
	// before it is tried again (at most until the holder's lease ends; it
	// is not nacked meanwhile), and a message that failed because the
	// store refused (guard.ErrUnavailable) before it is nacked, so the
	// subscriber does not redeliver it in a busy loop (which would spend a
	// broker's delivery limit during an outage, or a dead holder's lease).
	// Default 1s.
	InProgressDelay time.Duration
}

// Middleware deduplicates messages for a Watermill router or handler.
type Middleware struct {
	g     *guard.Guard
	opts  Options
	procs sync.Map // group → *consumerx.Processor
}

// New returns a Middleware over g. Add its Middleware method to a router
// or handler.
func New(g *guard.Guard, opts Options) (*Middleware, error) {
	if g == nil {
		return nil, errors.New("watermillx: nil guard")
	}
	if opts.InProgressDelay < 0 {
		return nil, errors.New("watermillx: negative InProgressDelay")
	}
	if opts.InProgressDelay == 0 {
		opts.InProgressDelay = DefaultInProgressDelay
	}
	m := &Middleware{g: g, opts: opts}
	if opts.Group != "" {
		if _, err := m.processor(opts.Group); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Middleware) processor(group string) (*consumerx.Processor, error) {
	if p, ok := m.procs.Load(group); ok {
		return p.(*consumerx.Processor), nil
	}
	p, err := consumerx.NewProcessor(m.g, group, m.opts.Process)
	if err != nil {
		return nil, fmt.Errorf("watermillx: %w", err)
	}
	actual, _ := m.procs.LoadOrStore(group, p)
	return actual.(*consumerx.Processor), nil
}

// Middleware is a message.HandlerMiddleware. The wrapped handler's return
// tells the router what to do: produced messages and nil to ack
// (Processed, Duplicate, DeadLettered), an error to nack (Failed,
// InProgress, Interrupted). A message in progress elsewhere is kept and
// tried again every Options.InProgressDelay (or when the holder's lease
// ends, if sooner) until it is not, and nacked only if the consumer stops
// first (its context cancelled, not its deadline: a Timeout middleware's
// is the handler's, counted from when the handler runs); one the store
// refused is held InProgressDelay before the nack. Behind a Timeout
// middleware added before this one (outside it), a router that closes
// while a message is held past that deadline goes unseen (a context that
// reached its deadline tells no later cancellation): the hold ends only
// when the holder completes or its lease ends, after the router's
// CloseTimeout. Add Timeout after this middleware
// (r.AddMiddleware(m.Middleware, middleware.Timeout(d))), where it bounds
// the handler alone and a hold sees the router close.
// The message's context is the consumer's: when it is cancelled while
// the handler runs (the router or subscriber is closing)
// and the handler returns an error, the message is Interrupted: its claim
// is released, no attempt is counted and nothing is dead-lettered, and it
// runs again when the broker delivers it again.
//
// A handler that panics does not take the router down, with or without
// Watermill's Recoverer: as in consumerx.Processor.ProcessBatch, the panic
// is a failed attempt of the message, which is nacked with an error
// matching guard.ErrPanicked (errors.As gives the *guard.PanicError with
// the value and the stack) and, after the attempt limit, dead-lettered
// (the cause matching guard.ErrExhausted) instead of coming back for
// ever. A handler that panics after the message's context was cancelled
// is Interrupted, as one that returns an error then is. The end of the
// message's context at its deadline (Watermill's Timeout middleware) is
// not the consumer stopping but the handler timing out: the handler sees
// it, and its failure then is a failed attempt.
//
// Give up on a message with Options.Process.DeadLetter (PublishDeadLetter),
// not Watermill's PoisonQueue middleware: inside this one, a poisoned
// message is recorded done (its handler returned nil) and a re-drive of
// it with the same UUID is a Duplicate that never runs; outside, a
// message in progress elsewhere or Interrupted is poisoned and acked.
func (m *Middleware) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		group := m.opts.Group
		if group == "" {
			group = message.HandlerNameFromCtx(ctx)
		}
		if group == "" {
			return nil, errors.New("watermillx: no Options.Group and no router handler name to use instead")
		}
		p, err := m.processor(group)
		if err != nil {
			return nil, err
		}
		cmsg := consumerx.Message{ID: ID(msg), Payload: msg.Payload, Metadata: msg.Metadata, Raw: msg}
		consumer, deadline, release := stopContext(ctx)
		defer release()
		timeout := time.Until(deadline) // the handler's (Watermill's Timeout middleware), if deadline is set
		var ran []*message.Message      // the produced messages of this delivery's run
		held := false                   // the message waited for another holder
		run := func(ctx context.Context, _ consumerx.Message) (_ []byte, err error) {
			orig := msg.Context()
			if !deadline.IsZero() {
				// The timeout is the handler's: a message held while it
				// was in progress elsewhere has it from when it runs.
				d := deadline
				if late := time.Now().Add(timeout); held && late.After(d) {
					d = late
				}
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, d)
				defer cancel()
			}
			msg.SetContext(ctx) // the handler sees the lease (consumerx.LeaseFrom) and its loss, and the deadline
			defer msg.SetContext(orig)
			defer func() {
				if v := recover(); v != nil {
					lease, _ := consumerx.LeaseFrom(ctx)
					err = panicerr.New(lease.Key, v)
				}
			}()
			produced, err := h(msg)
			if err != nil {
				return nil, err
			}
			ran = produced
			return encode(produced)
		}
		o, result, err := p.ProcessResult(consumer, cmsg, run)
		// In progress elsewhere: kept, not nacked, and tried again until
		// it is not (the holder completed it, or its lease ran out and it
		// is taken over). Nacked, it would come back at once, and a
		// holder that died would make it spend a broker's delivery limit
		// for the rest of its lease.
		for o == consumerx.InProgress && wait.For(consumer, inProgressWait(err, m.opts.InProgressDelay)) {
			held = true
			o, result, err = p.ProcessResult(consumer, cmsg, run)
		}
		switch o {
		case consumerx.Processed, consumerx.Duplicate:
			produced, derr := decode(result)
			if derr != nil {
				return nil, fmt.Errorf("watermillx: stored result of %s: %w", msg.UUID, derr)
			}
			if o == consumerx.Processed && len(ran) == len(produced) {
				// The handler's own contexts (a trace span), without the
				// lease's end.
				for i, pm := range ran {
					produced[i].SetContext(context.WithoutCancel(pm.Context()))
				}
			}
			return produced, nil
		case consumerx.DeadLettered:
			return nil, nil
		case consumerx.Failed:
			if errors.Is(err, guard.ErrUnavailable) {
				// The store refused: nacked at once, the message would
				// come straight back and spend a broker's delivery limit
				// in a tight loop for as long as the outage lasts.
				wait.For(consumer, m.opts.InProgressDelay)
			}
			return nil, err
		default:
			return nil, err
		}
	}
}

// inProgressWait is how long a message in progress elsewhere (err) waits
// before it is tried again: d, or less if the holder's lease ends first.
func inProgressWait(err error, d time.Duration) time.Duration {
	var ip *guard.InProgressError
	if errors.As(err, &ip) && ip.RetryAfter > 0 {
		return min(d, ip.RetryAfter)
	}
	return d
}

// ID returns the default id of msg: its UUID, or, when that is not a
// usable guard id (longer than guard.MaxIDLen, control characters,
// invalid UTF-8: a publisher sets the UUID), "sha256:<digest of the UUID>"
// (the digest in unpadded base64url), so that every message with a UUID
// has an id the guard can store. A message without a UUID (one a
// producer other than Watermill wrote) has no id: digested, every such
// message would share one key. consumerx dead-letters it (ErrNoKey) on
// every delivery without running it, and only logs it when no DeadLetter
// is set, so the message is acknowledged unrun: set Process.Key (from a
// header, a metadata field or the payload) where messages may come
// without a UUID.
func ID(msg *message.Message) string {
	if msg.UUID == "" || (guard.Key{Scope: "s", ID: msg.UUID}).Validate() == nil {
		return msg.UUID
	}
	sum := sha256.Sum256([]byte(msg.UUID))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// stopContext returns the context ctx's message is processed under as the
// consumer's own (consumerx.Processor.Process): it ends when ctx is
// cancelled (the router or subscriber is closing), not at ctx's deadline,
// which is a timeout of the handler (Watermill's Timeout middleware): a
// handler failing then has failed an attempt, and one that always times
// out is dead-lettered after the attempt limit, not released and
// redelivered for ever. deadline is ctx's, zero if it has none, for the
// handler's own context. release frees what stopContext set up.
func stopContext(ctx context.Context) (consumer context.Context, deadline time.Time, release func()) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return ctx, time.Time{}, func() {}
	}
	consumer, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel(context.Cause(ctx))
		}
	})
	return consumer, deadline, func() {
		stop()
		cancel(nil)
	}
}

// stored is a produced message as kept in the record. JSON would turn
// what is not valid UTF-8 into U+FFFD: such a UUID, and such metadata
// entries (a binary header), are kept as bytes in RawUUID and RawMeta.
type stored struct {
	UUID     string            `json:"u"`
	Metadata map[string]string `json:"m,omitempty"`
	Payload  []byte            `json:"p,omitempty"`
	RawUUID  []byte            `json:"ru,omitempty"`
	RawMeta  [][2][]byte       `json:"rm,omitempty"`
}

func encode(msgs []*message.Message) ([]byte, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	out := make([]stored, len(msgs))
	for i, m := range msgs {
		out[i] = stored{UUID: m.UUID, Metadata: m.Metadata, Payload: m.Payload}
		if !utf8.ValidString(m.UUID) {
			out[i].UUID, out[i].RawUUID = "", []byte(m.UUID)
		}
		if !validUTF8(m.Metadata) {
			out[i].Metadata = make(map[string]string, len(m.Metadata))
			for k, v := range m.Metadata {
				if utf8.ValidString(k) && utf8.ValidString(v) {
					out[i].Metadata[k] = v
				} else {
					out[i].RawMeta = append(out[i].RawMeta, [2][]byte{[]byte(k), []byte(v)})
				}
			}
		}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("watermillx: encode produced messages: %w", err)
	}
	return b, nil
}

func decode(b []byte) ([]*message.Message, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var in []stored
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, err
	}
	out := make([]*message.Message, len(in))
	for i, s := range in {
		uuid := s.UUID
		if s.RawUUID != nil {
			uuid = string(s.RawUUID)
		}
		out[i] = message.NewMessage(uuid, s.Payload)
		for k, v := range s.Metadata {
			out[i].Metadata.Set(k, v)
		}
		for _, kv := range s.RawMeta {
			out[i].Metadata.Set(string(kv[0]), string(kv[1]))
		}
	}
	return out, nil
}

// validUTF8 reports whether every key and value of md is valid UTF-8.
func validUTF8(md message.Metadata) bool {
	for k, v := range md {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return false
		}
	}
	return true
}

// Metadata keys of a dead-lettered message published by PublishDeadLetter.
const (
	MetadataDeadReason = "consumerx_dead_reason" // the cause, as text (consumerx.DeadLetterReason)
	MetadataDeadGroup  = "consumerx_dead_group"  // the router handler that gave up on it
)

// PublishDeadLetter returns a consumerx.Options.DeadLetter that publishes
// the message, with its UUID, payload and metadata, to topic on pub, adding
// MetadataDeadReason and MetadataDeadGroup (the router handler's name).
func PublishDeadLetter(pub message.Publisher, topic string) func(context.Context, consumerx.Message, error) error {
	return func(ctx context.Context, msg consumerx.Message, cause error) error {
		uuid := msg.ID
		if m, ok := msg.Raw.(*message.Message); ok {
			uuid = m.UUID // the message's own, not its digest (ID)
		}
		dead := message.NewMessage(uuid, msg.Payload)
		for k, v := range msg.Metadata {
			dead.Metadata.Set(k, v)
		}
		dead.Metadata.Set(MetadataDeadReason, consumerx.DeadLetterReason(cause))
		dead.Metadata.Set(MetadataDeadGroup, message.HandlerNameFromCtx(ctx))
		dead.SetContext(ctx)
		if err := pub.Publish(topic, dead); err != nil {
			return fmt.Errorf("watermillx: publish dead letter to %s: %w", topic, err)
		}
		return nil
	}
}
