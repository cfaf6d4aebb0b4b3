package consumerx

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/guard"
)

// BatchOptions configure ProcessBatch. The zero value runs the handlers
// one at a time, in the order of the messages.
type BatchOptions struct {
	// Concurrency is how many handlers of the batch run at once. 0 or 1:
	// one at a time, in order.
	Concurrency int
	// Ordered runs the handlers one at a time in the order of the
	// messages and stops at the first message that neither is processed
	// nor is a duplicate (Failed, InProgress, Interrupted, DeadLettered):
	// no later message's handler runs, and each later message whose key
	// was claimed is released and Skipped. So is a later message whose
	// claim the store answered otherwise (in progress, a mismatch, its
	// attempts spent), and a message without a usable id: each keeps its
	// place, and is dead-lettered only once every message before it was
	// processed or was a duplicate; the batch stops there too. A message
	// whose handler succeeded but whose completion the store refused
	// stops the batch only once every handler returned (the completions
	// are written then): a later handler has run, and its message is
	// Processed or Failed (a last attempt is not dead-lettered past the
	// stop: its next delivery is, in its turn).
	// Go on from the first message not acknowledged. For a Kafka
	// partition, whose records must run in order.
	Ordered bool
}

// BatchResult is ProcessBatch's answer for one message: what Process
// would have returned for it.
type BatchResult struct {
	Outcome Outcome
	Err     error
}

// ProcessBatch runs h for each of msgs whose (group, id) has not run, as
// Process does for each, with one answer per message in the order of
// msgs: the same outcomes, dead letters, logs and OnOutcome calls, the
// same shutdown rule (when ctx ends, a handler that then returns an error
// is Interrupted, and a message whose handler had not started is
// Interrupted without running), and no message's outcome depends on
// another's (but see BatchOptions.Ordered). The guard work is batched
// (guard.Guard.DoBatch): on a Redis store the batch's claims go out in one
// round trip and its completions, failures and releases in another, after
// every handler of the batch returned; each handler runs under its own
// lease, extended together with the others'.
//
// Unlike Process, a handler that panics does not take the consumer down:
// the panic is a failed attempt of the message, counted as a handler's
// error is, so that a message that always panics is dead-lettered after
// MaxAttempts (with a cause matching guard.ErrExhausted) instead of coming
// back for ever. Until then the message is Failed with an error matching
// guard.ErrPanicked (errors.As gives a *guard.PanicError with the value
// and the stack), logged at Error level, and redelivered. A handler that
// panics after ctx ended is Interrupted, as one that returns an error
// then is. A handler that calls runtime.Goexit has its claim released and
// no attempt counted. Run concurrently (Concurrency above 1), it is
// Failed with a *guard.PanicError; run one at a time, it runs on the
// caller's goroutine, and Goexit ends that goroutine, as it would end
// Process's caller, once the batch's claims are ended (guard.Guard.DoBatch):
// ProcessBatch does not return. A nil h is a programmer's error:
// ProcessBatch panics before it claims any key.
func (p *Processor) ProcessBatch(ctx context.Context, msgs []Message, h Handler, opts BatchOptions) []BatchResult {
	if h == nil {
		panic("consumerx: ProcessBatch: nil Handler")
	}
	out := make([]BatchResult, len(msgs))
	runs := make([]run, len(msgs))
	items := make([]guard.BatchItem, 0, len(msgs))
	var idx []int // the message of each item, once a message was left out
	fpErrs := p.fingerprintsInto(msgs, runs)
	bad, badErr := len(msgs), error(nil) // Ordered: the first message without a usable key
	for i := range msgs {
		key, err := p.Key(msgs[i])
		if err == nil && fpErrs != nil {
			err = fpErrs[i]
		}
		if err != nil && opts.Ordered {
			// It keeps its place: the batch runs up to it, and it is
			// dead-lettered only if every message before it is
			// acknowledged (below).
			bad, badErr = i, err
			break
		}
		if err != nil {
			if idx == nil {
				idx = make([]int, len(items), len(msgs))
				for j := range idx {
					idx[j] = j
				}
			}
			out[i].Outcome, _, out[i].Err = p.deadLetter(ctx, msgs[i], guard.Key{}, runs[i].fp, err)
			continue
		}
		runs[i].key = key
		items = append(items, guard.BatchItem{Key: key, Fingerprint: runs[i].fp})
		if idx != nil {
			idx = append(idx, i)
		}
	}
	res := p.g.DoBatch(ctx, items, func(lctx context.Context, j int, lease guard.Lease) ([]byte, error) {
		i := j
		if idx != nil {
			i = idx[j]
		}
		return runs[i].handle(ctx, lctx, lease, msgs[i], nil, h)
	}, guard.BatchOptions{Concurrency: opts.Concurrency, Ordered: opts.Ordered, CallOptions: p.call})
	retry := &completeBudget{wait: firstCompletePause} // the batch's completions tried again share it, from the first refusal
	var refused []int                                  // the results whose completion the store refused
	for j := range res {
		i := j
		if idx != nil {
			i = idx[j]
		}
		r := &runs[i]
		r.retry = retry
		if r.refused(res[j].Err) {
			r.retried = true
			refused = append(refused, j)
		}
	}
	if len(refused) > 0 {
		// The completions the store refused are tried again first, before
		// any dead letter of the batch is sent (settle, below): the user's
		// DeadLetter may take longer than a lease, and the batch no
		// longer extends these claims.
		rs := make([]*run, len(refused))
		vals := make([]guard.Result, len(refused))
		for k, j := range refused {
			i := j
			if idx != nil {
				i = idx[j]
			}
			rs[k], vals[k] = &runs[i], res[j].Result
		}
		for k, err := range p.recompleteAll(ctx, retry, rs, vals) {
			if err == nil {
				res[refused[k]].Err = nil
			}
		}
	}
	stop := false // Ordered: a message before was neither processed nor a duplicate
	for j := range res {
		i := j
		if idx != nil {
			i = idx[j]
		}
		if stop && !runs[i].ran && res[j].Err != nil {
			// Past the stop, a claim the store answered otherwise (a
			// mismatch, attempts spent, in progress) waits for the
			// message's turn: its dead letter is sent then, in order, as a
			// bad key's is (docs/design.md, "Batches"). After a shutdown
			// it is Interrupted, never dead-lettered past the stop.
			out[i] = BatchResult{Outcome: Skipped, Err: skippedAfterStop(msgs[i], res[j].Err)}
			if ctx.Err() != nil {
				out[i] = BatchResult{Outcome: Interrupted, Err: fmt.Errorf("consumerx: message %s, past an ordered batch's stop, as the consumer's context ended (its claim: %w): %w",
					msgs[i].ID, res[j].Err, context.Cause(ctx))}
			}
			continue
		}
		// A handler past the stop ran (the message before it was
		// refused its completion, which is written after every handler
		// returned): its failure is recorded, and a last attempt's is
		// dead-lettered by the message's next delivery, in its turn.
		runs[i].pastStop = stop
		out[i].Outcome, _, out[i].Err = p.settle(ctx, msgs[i], &runs[i], res[j].Result, res[j].Err)
		stop = stop || opts.Ordered && out[i].Outcome != Processed && out[i].Outcome != Duplicate
	}
	if bad < len(msgs) {
		// The batch stops at the bad message, as at any dead letter.
		i := bad
		if allDone(out[:bad]) {
			out[i].Outcome, _, out[i].Err = p.deadLetter(ctx, msgs[i], guard.Key{}, runs[i].fp, badErr)
			i++
		}
		for ; i < len(msgs); i++ {
			out[i] = BatchResult{Outcome: Skipped, Err: fmt.Errorf("%w: message %s", guard.ErrSkipped, msgs[i].ID)}
		}
	}
	for i := range msgs {
		p.report(ctx, msgs[i], out[i].Outcome, out[i].Err)
	}
	return out
}

// skippedAfterStop is the error of msg, Skipped after an ordered batch's
// stop, whose claim the guard answered with err: err itself if it says
// the batch skipped msg, else one that names err without matching it (msg
// is not in progress, mismatched or exhausted until its turn says so).
func skippedAfterStop(msg Message, err error) error {
	if errors.Is(err, guard.ErrSkipped) {
		return err
	}
	return fmt.Errorf("%w: message %s (its claim: %v)", guard.ErrSkipped, msg.ID, err)
}

// allDone reports whether every one of out was processed or a duplicate:
// an Ordered batch that got that far goes on.
func allDone(out []BatchResult) bool {
	for _, r := range out {
		if r.Outcome != Processed && r.Outcome != Duplicate {
			return false
		}
	}
	return true
}
