package proof

import (
	"context"

	"github.com/idemguard/idemguard/guard"
)

var _ guard.BatchStore = (*Recorder)(nil)

// ClaimBatch implements guard.BatchStore: the inner store's ClaimBatch
// (its per-key Claims when it has none), each claim recorded as an
// operation of its own that spans the whole batch's call, as a client sees
// it: the store may have taken each claim at any moment of it.
func (r *Recorder) ClaimBatch(ctx context.Context, reqs []guard.ClaimRequest) ([]guard.Outcome, []error) {
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	var (
		out  []guard.Outcome
		errs []error
	)
	if bs, ok := r.inner.(guard.BatchStore); ok {
		out, errs = bs.ClaimBatch(cctx, reqs)
	} else {
		out, errs = make([]guard.Outcome, len(reqs)), make([]error, len(reqs))
		for i := range reqs {
			out[i], errs[i] = r.inner.Claim(cctx, reqs[i])
		}
	}
	for i, req := range reqs {
		r.record(ctx, claimInput(req), call, claimOutput(out[i]), errs[i])
	}
	return out, errs
}

// WriteBatch implements guard.BatchStore as ClaimBatch does: each write
// an operation of its own spanning the batch's call.
func (r *Recorder) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	call := r.now()
	cctx, cancel := r.bound(ctx)
	defer cancel()
	var errs []error
	if bs, ok := r.inner.(guard.BatchStore); ok {
		errs = bs.WriteBatch(cctx, ws)
	} else {
		errs = make([]error, len(ws))
		for i, w := range ws {
			switch w.Kind {
			case guard.WriteComplete:
				errs[i] = r.inner.Complete(cctx, w.Lease, w.Result, w.TTL)
			case guard.WriteFail:
				errs[i] = r.inner.Fail(cctx, w.Lease, w.Reason, w.TTL)
			case guard.WriteRelease:
				errs[i] = r.inner.Release(cctx, w.Lease)
			case guard.WriteExtend:
				errs[i] = r.inner.Extend(cctx, w.Lease, w.TTL)
			}
		}
	}
	for i, w := range ws {
		in := Input{Key: w.Lease.Key, Token: w.Lease.Token}
		switch w.Kind {
		case guard.WriteComplete:
			in.Op, in.Value = OpComplete, string(w.Result)
		case guard.WriteFail:
			in.Op, in.Value = OpFail, w.Reason
		case guard.WriteRelease:
			in.Op = OpRelease
		case guard.WriteExtend:
			in.Op = OpExtend
		}
		r.record(ctx, in, call, Output{OK: true}, errs[i])
	}
	return errs
}

func claimInput(req guard.ClaimRequest) Input {
	return Input{Op: OpClaim, Key: req.Key, Token: req.Token, Fingerprint: req.Fingerprint, MaxAttempts: req.MaxAttempts}
}

func claimOutput(o guard.Outcome) Output {
	out := Output{Status: o.Status, Result: string(o.Result), LastError: o.LastError}
	switch o.Status {
	case guard.Acquired:
		out.Fence, out.Attempt, out.Recovered = o.Lease.Fence, o.Lease.Attempt, o.Lease.Recovered
	case guard.Exhausted:
		out.Attempt = o.Attempts
	}
	return out
}
