package backstop_test

import (
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// keepsNoSteps is a StepStore whose KeepsSteps answers false, as a
// fallback.Store over a store keeping no steps does.
type keepsNoSteps struct{ guard.StepStore }

func (keepsNoSteps) KeepsSteps() bool { return false }

// TestWrapKeepsStepsAsPrimary: the wrapped store of a StepStore answers
// guard.KeepsSteps as the primary does, so over one keeping no steps
// guard.Step answers guard.ErrStepsUnsupported before the step runs, in
// every attempt (it ran the step each time, its result kept nowhere).
func TestWrapKeepsStepsAsPrimary(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	rs := guardenv.StoreOn(t, testenv.Redis(t), guard.RedisOptions{})
	for _, tc := range []struct {
		name    string
		primary guard.Store
		keeps   bool
	}{
		{"redis store", rs, true},
		{"keeps no steps", keepsNoSteps{rs}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wrapped := backstop.Wrap(tc.primary, b)
			storetest.StepRunsWhereKept(t, wrapped, newKey(t), tc.keeps)
		})
	}
}
