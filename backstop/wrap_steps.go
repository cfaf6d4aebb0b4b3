package backstop

import (
	"context"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
)

// wrappedSteps is the store Wrap returns over a primary that keeps steps
// (and wrappedStepsBatches over one that also serves batches).
type wrappedSteps struct {
	*wrappedStore
	stepsOf
}

var _ guard.StepStore = (*wrappedSteps)(nil)

// stepsOf is the steps half of a wrapped store: primary's StepStore.
type stepsOf struct{ steps guard.StepStore }

// SaveStep records the step in primary, retried while primary cannot be
// reached as the writes that end a claim are (a step is safe to send
// again: the same step answers OK).
func (s stepsOf) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	return adapter.Settle(ctx, adapter.SettleBudget, func(ctx context.Context) error { return s.steps.SaveStep(ctx, lease, index, step) })
}

// KeepsSteps answers as primary does (see guard.StepStore): over a store
// keeping no steps (a fallback.Store over one), guard.Step refuses before
// the step runs.
func (s stepsOf) KeepsSteps() bool { return guard.KeepsSteps(s.steps) }
