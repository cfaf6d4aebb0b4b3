package guard_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// wrapped is a wrapper of your own around a StepStore (one that logs,
// times or traces its calls): it forwards SaveStep, and KeepsSteps, so
// the guard knows whether the stores under it keep the steps it takes.
type wrapped struct{ guard.StepStore }

func (w wrapped) KeepsSteps() bool { return guard.KeepsSteps(w.StepStore) }

// A store keeps steps when it is a StepStore whose KeepsSteps, if it has
// one, answers true. Over one that keeps none, Step refuses before the
// step runs.
func ExampleKeepsSteps() {
	mem := memstore.New(memstore.Options{})
	fmt.Println("memstore:", guard.KeepsSteps(mem))
	fmt.Println("wrapper over memstore:", guard.KeepsSteps(wrapped{mem}))

	onlyStore := struct{ guard.Store }{mem} // hides SaveStep
	fmt.Println("only a Store:", guard.KeepsSteps(onlyStore))

	g := guard.New(onlyStore, guard.Options{})
	ran := false
	_, err := g.Do(context.Background(), guard.Key{Scope: "orders", ID: "o-1"}, "fp", func(ctx context.Context, l guard.Lease) ([]byte, error) {
		_, err := guard.Step(ctx, l, "charge", func(context.Context) ([]byte, error) { ran = true; return nil, nil })
		return nil, err
	})
	fmt.Println("step ran:", ran, "unsupported:", errors.Is(err, guard.ErrStepsUnsupported))
	// Output:
	// memstore: true
	// wrapper over memstore: true
	// only a Store: false
	// step ran: false unsupported: true
}
