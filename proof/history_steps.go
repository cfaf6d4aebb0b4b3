package proof

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/guard"
)

var _ guard.StepStore = (*Recorder)(nil)

// SaveStep implements guard.StepStore: it passes the call to the inner
// store, which must be a guard.StepStore (else it answers
// guard.ErrStepsUnsupported, recorded as a bad call), and records it.
func (r *Recorder) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	in := Input{Op: OpStep, Key: lease.Key, Token: lease.Token, Index: index, Name: step.Name, Value: string(step.Result)}
	call := r.now()
	ss, ok := r.inner.(guard.StepStore)
	if !ok {
		err := fmt.Errorf("proof: %w: %T", guard.ErrStepsUnsupported, r.inner)
		r.record(ctx, in, call, Output{}, err)
		return err
	}
	cctx, cancel := r.bound(ctx)
	defer cancel()
	err := ss.SaveStep(cctx, lease, index, step)
	if errors.Is(err, guard.ErrStepOrder) {
		r.record(ctx, in, call, Output{Order: true}, nil)
		return err
	}
	r.record(ctx, in, call, Output{OK: true}, err)
	return err
}

// KeepsSteps answers as the inner store does (see guard.StepStore): over a
// store keeping no steps, guard.Step refuses before the step runs rather
// than run it and record the bad call here.
func (r *Recorder) KeepsSteps() bool { return guard.KeepsSteps(r.inner) }
