package consumerx

import (
	"context"

	"github.com/idemguard/idemguard/consumerx/internal/leasectx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
)

// Message is one delivery of a broker's message, as the adapters hand it to
// a Handler. A redelivery of the same message carries the same ID.
type Message struct {
	// ID is the broker's id of the message (a Redis stream and entry id, a
	// Watermill UUID, a JetStream Nats-Msg-Id or stream sequence, a Kafka
	// topic/partition/offset). Options.Key may pick another.
	ID string
	// Payload is the message body.
	Payload []byte
	// Metadata holds the message's headers or fields.
	Metadata map[string]string
	// Raw is the broker's own message (redis.XMessage, *message.Message,
	// jetstream.Msg, *kgo.Record), for key functions and handlers that need
	// more than the fields above.
	Raw any
}

// Handler is the user's callback for one message. A nil error means the
// message's effect is done; any error is a failure to be retried, counted
// toward Options.MaxAttempts (one wrapping guard.ErrRejected too: it does
// not release the claim as it does under guard.Do), unless the
// consumer's context had ended (see Interrupted).
type Handler func(ctx context.Context, msg Message) error

// ResultFunc is a Handler that also returns a result, stored with the
// message's record and handed back, without running again, for every
// duplicate (Watermill's produced messages, for example).
type ResultFunc func(ctx context.Context, msg Message) ([]byte, error)

// leaseCtx is a handler's context: the lease's context, which carries
// the lease for LeaseFrom. It lives in the message's run, so it costs no
// allocation of its own (context.WithValue would).
type leaseCtx struct {
	context.Context
	lease *guard.Lease
}

// Value returns the lease for LeaseFrom's key, and the lease context's
// values otherwise (context.Cause and derived contexts find its
// cancellation through it).
func (c *leaseCtx) Value(key any) any {
	if key == (leasectx.Key{}) {
		return c.lease
	}
	return c.Context.Value(key)
}

// LeaseFrom returns the guard lease a Handler runs under: its Fence, to be
// carried by downstream writes that must not happen twice, and its Attempt
// (1 for the first run). ok is false outside a wrapped handler.
func LeaseFrom(ctx context.Context) (lease guard.Lease, ok bool) {
	l, ok := ctx.Value(leasectx.Key{}).(*guard.Lease)
	if !ok {
		return guard.Lease{}, false
	}
	return *l, true
}

// MaxDeadLetterReason is the most bytes of a cause's text that
// DeadLetterReason keeps.
const MaxDeadLetterReason = 1024

// DeadLetterReason is the text of cause that the adapters' dead letters
// carry (a Kafka header, a Watermill metadata field, a stream field): at
// most MaxDeadLetterReason bytes of it, cut on a UTF-8 boundary and
// marked "…(truncated)" when cut. A handler's error can be as long as an
// upstream's error page, and a dead letter that cannot be written (a
// record over the broker's size limit) would be tried again on every
// delivery, holding up the messages behind it.
func DeadLetterReason(cause error) string {
	if cause == nil {
		return ""
	}
	s := cause.Error()
	if len(s) <= MaxDeadLetterReason {
		return s
	}
	const mark = "…(truncated)"
	return adapter.CutText(s, MaxDeadLetterReason-len(mark)) + mark
}
