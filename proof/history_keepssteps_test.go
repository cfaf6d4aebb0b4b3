package proof

import (
	"testing"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/memstore"
)

// TestRecorderKeepsStepsAsInner: a Recorder is a guard.StepStore whatever
// it records; over a store keeping no steps it says so (guard.KeepsSteps),
// and guard.Step answers guard.ErrStepsUnsupported before the step runs
// rather than run it in every attempt, its result kept nowhere.
func TestRecorderKeepsStepsAsInner(t *testing.T) {
	for _, tc := range []struct {
		name  string
		inner guard.Store
		keeps bool
	}{
		{"memstore", memstore.New(memstore.Options{}), true},
		{"no steps", struct{ guard.Store }{memstore.New(memstore.Options{})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := NewRecorder(tc.inner)
			storetest.StepRunsWhereKept(t, rec, guard.Key{Scope: "steps", ID: tc.name}, tc.keeps)
		})
	}
}
