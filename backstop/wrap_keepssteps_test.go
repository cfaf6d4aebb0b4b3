package backstop_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
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
			if got := guard.KeepsSteps(wrapped); got != tc.keeps {
				t.Errorf("KeepsSteps = %v, want %v", got, tc.keeps)
			}
			g := guard.New(wrapped, guard.Options{MaxAttempts: 10})
			key := newKey(t)
			ran := 0
			for attempt := range 3 {
				_, err := g.Do(context.Background(), key, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
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
