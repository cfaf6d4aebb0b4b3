package gateway

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/promx"
)

// keepsNoSteps is a StepStore whose KeepsSteps answers false, as a
// fallback.Store over a store keeping no steps does.
type keepsNoSteps struct{ guard.StepStore }

func (keepsNoSteps) KeepsSteps() bool { return false }

// TestTimedStoreKeepsStepsAsStore: the gateway's store, timed by promx,
// is a StepStore answering guard.KeepsSteps as the store under it does, so
// guard.Step (the forward step) refuses before it runs over a store
// keeping none.
func TestTimedStoreKeepsStepsAsStore(t *testing.T) {
	gm, err := promx.New(prometheus.NewRegistry(), promx.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New(memstore.Options{})
	for _, tc := range []struct {
		steps guard.StepStore
		keeps bool
	}{
		{mem, true},
		{keepsNoSteps{mem}, false},
	} {
		timed := gm.Store(tc.steps)
		if _, ok := timed.(guard.StepStore); !ok {
			t.Fatalf("%T: the timed store is no StepStore", tc.steps)
		}
		if got := guard.KeepsSteps(timed); got != tc.keeps {
			t.Errorf("%T: KeepsSteps = %v, want %v", tc.steps, got, tc.keeps)
		}
	}
}
