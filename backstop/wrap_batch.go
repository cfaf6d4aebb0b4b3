package backstop

import (
	"context"
	"errors"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/parallel"
)

// The stores Wrap returns over a primary that serves batches
// (guard.BatchStore), with steps or without: a batch's claims and writes
// go to primary in its round trips, and each key gets the backstop's
// checks as its own call would.
type (
	wrappedBatches struct {
		*wrappedStore
		batchesOf
	}
	wrappedStepsBatches struct {
		*wrappedStore
		stepsOf
		batchesOf
	}
)

var (
	_ guard.BatchStore = (*wrappedBatches)(nil)
	_ guard.BatchStore = (*wrappedStepsBatches)(nil)
	_ guard.StepStore  = (*wrappedStepsBatches)(nil)
)

// batchesOf is the batch half of a wrapped store.
type batchesOf struct {
	g  *wrappedStore
	bs guard.BatchStore
}

// batchWorkers bounds the keys of a batch whose backstop checks (a
// PostgreSQL statement each) run at once, as guard bounds the calls of a
// store without batches.
const batchWorkers = 16

// ClaimBatch claims every request in primary's batch, then checks each
// claim primary answered as Claim does: a mark in PostgreSQL for each key
// acquired, the committed result for a key exhausted.
func (b batchesOf) ClaimBatch(ctx context.Context, reqs []guard.ClaimRequest) ([]guard.Outcome, []error) {
	out, errs := b.bs.ClaimBatch(ctx, reqs)
	parallel.Each(len(reqs), batchWorkers, func(i int) {
		if errs[i] == nil {
			out[i], errs[i] = b.g.claimed(ctx, reqs[i], out[i])
		}
	})
	return out, errs
}

// WriteBatch makes every write in primary's batch. A write that primary
// could not be reached for is made again on its own, retried as Complete,
// Fail and Release retry (Extend is not); a failed or released lease
// ends on its mark, and a first attempt released has its mark undone, as
// Fail and Release do, and an extended lease its mark extended, as Extend
// does (a mark not extended is the write's error, as for Extend).
func (b batchesOf) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	errs := b.bs.WriteBatch(ctx, ws)
	parallel.Each(len(ws), batchWorkers, func(i int) {
		w := &ws[i]
		if errors.Is(errs[i], guard.ErrUnavailable) {
			switch w.Kind {
			case guard.WriteComplete:
				errs[i] = b.g.Complete(ctx, w.Lease, w.Result, w.TTL)
			case guard.WriteFail:
				errs[i] = b.g.Fail(ctx, w.Lease, w.Reason, w.TTL) // unmarks too
				return
			case guard.WriteRelease:
				errs[i] = b.g.Release(ctx, w.Lease) // unmarks too
				return
			}
		}
		switch {
		case w.Kind == guard.WriteFail && holderDone(errs[i]):
			b.g.unmark(ctx, w.Lease, false, true)
		case w.Kind == guard.WriteRelease && holderDone(errs[i]):
			b.g.unmark(ctx, w.Lease, errs[i] == nil && b.g.forgot(ctx, w.Lease.Key), false)
		case w.Kind == guard.WriteExtend && errs[i] == nil:
			errs[i] = b.g.extendMark(ctx, w.Lease, w.TTL) // as Extend does
		}
	})
	return errs
}
