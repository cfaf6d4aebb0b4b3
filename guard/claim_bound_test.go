package guard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// claimsToTheBound is a store whose claims answer only when their context ends,
// with the context's error, as a store that honours its context does.
type claimsToTheBound struct{ guard.Store }

func (s claimsToTheBound) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	<-ctx.Done()
	return guard.Outcome{}, ctx.Err()
}

// Claim's doc: "Past the bound [the lease's first deadline] the outcome is
// unknown (ErrUnavailable)". Claim, ClaimWith and Wait report a claim cut
// off by that bound so, as Do and Hold do, and the Observer hears of it,
// whatever the store makes of its context's end. (They returned a store's
// bare context.DeadlineExceeded, which matched no sentinel.)
func TestClaimPastBoundUnavailable(t *testing.T) {
	var unavailable atomic.Int32
	obs := guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable {
			unavailable.Add(1)
		}
	})
	g := guard.New(claimsToTheBound{realStore(t)}, guard.Options{Lease: 50 * time.Millisecond, Observer: obs})
	key := guard.Key{Scope: "claim-bound", ID: t.Name() + time.Now().Format("150405.000000000")}

	_, derr := g.Do(bg, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { return nil, nil })
	if !errors.Is(derr, guard.ErrUnavailable) {
		t.Fatalf("Do (control): %v", derr)
	}
	unavailable.Store(0)
	_, err := g.Claim(bg, key, "fp")
	if !errors.Is(err, guard.ErrUnavailable) || unavailable.Load() != 1 {
		t.Fatalf("Claim past its bound: %v (matches ErrUnavailable: %v), EventUnavailable observed %d times; Do on the same store: %v",
			err, errors.Is(err, guard.ErrUnavailable), unavailable.Load(), derr)
	}
}
