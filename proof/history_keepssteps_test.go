package proof

import (
	"context"
	"errors"
	"testing"

	"github.com/idemguard/idemguard/guard"
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
			if got := guard.KeepsSteps(rec); got != tc.keeps {
				t.Errorf("KeepsSteps = %v, want %v", got, tc.keeps)
			}
			g := guard.New(rec, guard.Options{MaxAttempts: 10})
			ran := 0
			for attempt := range 3 {
				_, err := g.Do(context.Background(), guard.Key{Scope: "steps", ID: tc.name}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
					if _, err := guard.Step(ctx, l, "charge", func(context.Context) ([]byte, error) { ran++; return []byte("ch_1"), nil }); err != nil {
						return nil, err
					}
					return nil, errors.New("crash after the step")
				})
				if !tc.keeps && !errors.Is(err, guard.ErrStepsUnsupported) {
					t.Fatalf("attempt %d: %v, want ErrStepsUnsupported", attempt, err)
				}
			}
			if want := map[bool]int{true: 1, false: 0}[tc.keeps]; ran != want {
				t.Fatalf("the step ran %d times in 3 attempts, want %d", ran, want)
			}
		})
	}
}
