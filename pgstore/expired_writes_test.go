package pgstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
)

// TestWritesAfterRetentionLost: a record whose lease and retention
// both passed (its holder stopped, nobody claimed the key since) is
// absent, and a write its holder sends then is ErrLeaseLost and changes
// nothing, as on a key never claimed (StaleTokenChangesNothing: "on an
// absent key, writes other than release are lost"): Complete, Fail,
// Extend and SaveStep do not bring the forgotten record back, and the
// key's next claim is a first attempt. A store that took them revives a
// key every other call has treated as gone: a completion replayed under
// a key whose next request already ran as new, a failure counted
// against the key's next life, a lease nobody can take over.
// (a mutation review: pgstore's complete, fail, extend and step
// statements without their live-record condition passed every test.)
func TestWritesAfterRetentionLost(t *testing.T) {
	t.Parallel()
	for name, s := range retentionStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			writes := []struct {
				name  string
				write func(guard.Lease) error
			}{
				{"complete", func(l guard.Lease) error { return s.Complete(ctx, l, []byte("late"), time.Hour) }},
				{"fail", func(l guard.Lease) error { return s.Fail(ctx, l, "late", time.Hour) }},
				{"extend", func(l guard.Lease) error { return s.Extend(ctx, l, time.Hour) }},
			}
			if ss, ok := s.(guard.StepStore); ok && guard.KeepsSteps(s) {
				writes = append(writes, struct {
					name  string
					write func(guard.Lease) error
				}{"step", func(l guard.Lease) error {
					return ss.SaveStep(ctx, l, 0, guard.StepResult{Name: "a", Result: []byte("1")})
				}})
			}
			req := func(key guard.Key, tok string) guard.ClaimRequest {
				return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: 100 * time.Millisecond, TTL: 100 * time.Millisecond}
			}
			leases := make([]guard.Lease, len(writes))
			for i, w := range writes {
				leases[i] = retentionClaim(t, s, req(guard.Key{Scope: "retention", ID: "expired-" + w.name}, "A"))
			}
			storetest.Wait(t, 200*time.Millisecond) // every lease and the retention after it pass
			for i, w := range writes {
				l := leases[i]
				if _, err := s.Get(ctx, l.Key); !errors.Is(err, guard.ErrNotFound) {
					t.Fatalf("%s: Get after the lease and retention = %v, want ErrNotFound", w.name, err)
				}
				if err := w.write(l); !errors.Is(err, guard.ErrLeaseLost) {
					t.Errorf("%s from the holder of a forgotten record = %v, want ErrLeaseLost", w.name, err)
				}
				if rec, err := s.Get(ctx, l.Key); !errors.Is(err, guard.ErrNotFound) {
					t.Errorf("%s brought the forgotten record back: %+v, %v", w.name, rec, err)
				}
				r := req(l.Key, "B")
				r.Lease = time.Hour
				out, err := s.Claim(ctx, r)
				if err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 1 || out.Lease.Recovered || len(out.Steps) != 0 {
					t.Errorf("claim after the forgotten holder's %s = %+v, %v; want a first attempt without steps", w.name, out, err)
				}
			}
		})
	}
}
