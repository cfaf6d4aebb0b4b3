package backstop

import (
	"context"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/adapter"
)

// wrappedSteps is the store Wrap returns over a primary that keeps steps.
type wrappedSteps struct {
	wrappedStore
	steps guard.StepStore
}

var _ guard.StepStore = (*wrappedSteps)(nil)

// SaveStep records the step in primary, retried while primary cannot be
// reached as the writes that end a claim are (a step is safe to send
// again: the same step answers OK).
func (g *wrappedSteps) SaveStep(ctx context.Context, lease guard.Lease, index int, step guard.StepResult) error {
	return adapter.Settle(ctx, adapter.SettleBudget, func(ctx context.Context) error { return g.steps.SaveStep(ctx, lease, index, step) })
}
