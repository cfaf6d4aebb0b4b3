package memstore_test

import (
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/memstore"
)

// TestContract runs the whole store contract, lease expiry and retention
// included, with time moved by a manual clock: no sleeps. Every store's
// bookkeeping is checked when its subtest ends.
func TestContract(t *testing.T) {
	storetest.Run(t, harness(memstore.Options{}))
}

// TestContractBounded: the same with bounds the contract never reaches,
// so the bookkeeping of bytes runs through every state change.
func TestContractBounded(t *testing.T) {
	storetest.Run(t, harness(memstore.Options{MaxRecords: 1 << 20, MaxBytes: 1 << 30}))
}

func harness(opts memstore.Options) storetest.Harness {
	var clocks sync.Map // *testing.T → *clock: each subtest moves its own store's time
	return storetest.Harness{
		New: func(t *testing.T) guard.Store {
			c, _ := clocks.LoadOrStore(t, newClock())
			t.Cleanup(func() { clocks.Delete(t) })
			o := opts
			o.Now = c.(*clock).Now
			s := memstore.New(o)
			t.Cleanup(func() { checkInvariants(t, s) })
			return s
		},
		Advance: func(t *testing.T, d time.Duration) {
			c, ok := clocks.Load(t)
			if !ok {
				t.Fatal("Advance before New")
			}
			c.(*clock).Advance(d)
		},
	}
}

// keepsNoSteps is a StepStore whose KeepsSteps answers false, as a
// fallback.Store over a store keeping no steps does.
type keepsNoSteps struct{ guard.StepStore }

func (keepsNoSteps) KeepsSteps() bool { return false }

// TestContractKeepingNoSteps: the contract over a StepStore that says it
// keeps no steps: every case but the steps passes as over memstore, and
// guard.Step refuses before the step runs (the contract used to run the
// StepStore cases on it, which guard.Step fails).
func TestContractKeepingNoSteps(t *testing.T) {
	h := harness(memstore.Options{})
	newStore := h.New
	h.New = func(t *testing.T) guard.Store { return keepsNoSteps{newStore(t).(guard.StepStore)} }
	storetest.Run(t, h)
}
