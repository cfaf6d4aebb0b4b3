package guard_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// countExtends is a real store that counts its extensions.
type countExtends struct {
	guard.Store
	n atomic.Int64
}

func (s *countExtends) Extend(ctx context.Context, l guard.Lease, d time.Duration) error {
	s.n.Add(1)
	return s.Store.Extend(ctx, l, d)
}

// TestHeartbeatPace: Do's heartbeat "extends the lease every
// Lease/3 while the effect runs" (keepalive's doc comment;
// docs/design.md, "Leases"): after an extension that succeeded, the next
// is due a third of a lease after it was sent. An effect that runs 1.2
// leases gets about 3 extensions, not one extension after another as
// fast as Redis answers them. Kills mutant N05 (keepalive.fire without
// `k.beat = sent.Add(k.g.opts.Lease / 3)` after a successful extension:
// the next one was due at once, every round trip, for the whole run).
func TestHeartbeatPace(t *testing.T) {
	const lease = 300 * time.Millisecond
	s := &countExtends{Store: realStore(t)}
	g := guard.New(s, guard.Options{Lease: lease})
	_, err := g.Do(bg, guard.Key{Scope: "mutation", ID: t.Name()}, "fp", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(lease + lease/5):
		}
		return []byte("v"), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Due at Lease/3, 2·Lease/3 and Lease after the claim: 3, or 4 with a
	// retry; anything near 10 is extensions sent back to back.
	if n := s.n.Load(); n < 1 || n > 8 {
		t.Fatalf("%d extensions in a run of %s with a lease of %s, want about 3 (one every Lease/3)", n, lease+lease/5, lease)
	}
}
