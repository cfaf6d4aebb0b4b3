package consumerx

import (
	"context"
	"runtime/debug"
)

// Outcome is what a wrapped handler made of one delivery, and tells the
// adapter what to do with it.
type Outcome uint8

// Outcomes of a delivery.
const (
	// Processed: the handler ran and succeeded; acknowledge.
	Processed Outcome = iota + 1
	// Duplicate: the message was processed before; acknowledge without
	// running the handler.
	Duplicate
	// InProgress: another consumer is running the message now; do not
	// acknowledge, let the broker deliver it again later.
	InProgress
	// Failed: the handler (or the store) failed; do not acknowledge, so the
	// message is retried.
	Failed
	// DeadLettered: the message cannot succeed (its attempts ran out, its
	// id is unusable, or its id was reused with another payload); it was
	// handed to the dead letter and is to be acknowledged.
	DeadLettered
	// Interrupted: the consumer's own context ended (shutdown, rebalance)
	// before the handler finished, and the handler returned an error; the
	// claim was released, so no attempt is counted and nothing is
	// dead-lettered for it. Do not acknowledge: the message runs again on
	// its next delivery, to this consumer or another. A message whose
	// dead letter could not be sent once the context ended is Interrupted
	// too: its next delivery dead-letters it.
	Interrupted
	// Skipped: the message came after one that was neither processed nor
	// a duplicate (not acknowledged, or dead-lettered) in a batch
	// processed in order (ProcessBatch with BatchOptions.Ordered), so its
	// handler did not run and it was not dead-lettered; its claim, if
	// made, was released, and no attempt is counted. Do not acknowledge:
	// its turn comes after the earlier message's.
	Skipped
)

var outcomeNames = [...]string{"", "processed", "duplicate", "in_progress", "failed", "dead_lettered", "interrupted", "skipped"}

// String returns the outcome's name ("processed", "duplicate", …), for logs
// and metric labels.
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) && o != 0 {
		return outcomeNames[o]
	}
	return "unknown"
}

// Ack reports whether the adapter should acknowledge the delivery: true for
// Processed, Duplicate and DeadLettered.
func (o Outcome) Ack() bool { return o == Processed || o == Duplicate || o == DeadLettered }

// onOutcome tells Options.OnOutcome msg's outcome o. A panic of it goes
// no further than a log at Error level: the outcome was decided and
// written before, and escaping, the panic would lose the answers of a
// whole batch (none acknowledged, each message a Duplicate on
// redelivery, where the observer panics again) and take the consumer down.
func (p *Processor) onOutcome(ctx context.Context, msg Message, o Outcome, err error) {
	defer func() {
		if v := recover(); v != nil {
			p.log.ErrorContext(ctx, "consumerx: Options.OnOutcome panicked; the outcome stands",
				"id", msg.ID, "outcome", o.String(), "panic", v, "stack", string(debug.Stack()))
		}
	}()
	p.opts.OnOutcome(ctx, msg, o, err)
}
