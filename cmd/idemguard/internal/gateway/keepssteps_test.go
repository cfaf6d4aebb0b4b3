package gateway

import (
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// keepsNoSteps is a StepStore whose KeepsSteps answers false, as a
// fallback.Store over a store keeping no steps does.
type keepsNoSteps struct{ guard.StepStore }

func (keepsNoSteps) KeepsSteps() bool { return false }

// TestStepsThroughKeepsStepsAsStore: the timed store with the steps of the
// store under it answers guard.KeepsSteps as that store does, so guard.Step
// (the forward step) refuses before it runs over a store keeping none.
func TestStepsThroughKeepsStepsAsStore(t *testing.T) {
	mem := memstore.New(memstore.Options{})
	for _, tc := range []struct {
		steps guard.StepStore
		keeps bool
	}{
		{mem, true},
		{keepsNoSteps{mem}, false},
	} {
		if got := guard.KeepsSteps(stepsThrough{Store: mem, steps: tc.steps}); got != tc.keeps {
			t.Errorf("%T: KeepsSteps = %v, want %v", tc.steps, got, tc.keeps)
		}
	}
}
