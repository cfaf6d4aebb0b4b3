package backstop_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestStepsResumeAcrossStores: on the Redis store, the PostgreSQL
// Store and backstop.Wrap alike, a holder that recorded two steps and
// died (its lease ran out) leaves them to the next holder: they are
// returned and not run again, the unrecorded step runs once, KeyFor
// gives both holders the same downstream key, and the dead holder's late
// steps (a new one, and one byte for byte the new holder's) are refused
// without touching the new holder's steps.
func TestStepsResumeAcrossStores(t *testing.T) {
	for name, s := range stepStores(t) {
		t.Run(name, func(t *testing.T) {
			testenv.OnTime(t, "a lease", 500*time.Millisecond, 3, func(lease time.Duration) bool {
				g := guard.New(s, guard.Options{Lease: lease})
				key := guard.Key{Scope: "steps-resume", ID: fmt.Sprint(name, "/", lease, "/", time.Now().UnixNano())}
				var mu sync.Mutex
				runs := map[string]int{}
				keys := map[string]string{}
				step := func(ctx context.Context, l guard.Lease, holder, n string) (string, error) {
					return guard.Step(ctx, l, n, func(context.Context) (string, error) {
						mu.Lock()
						defer mu.Unlock()
						runs[holder+"/"+n]++
						keys[holder+"/"+n] = l.KeyFor(n)
						return n + " by " + holder, nil
					})
				}
				began := time.Now()
				out, err := g.Claim(bg, key, "fp") // A: no heartbeat, as a process that stops
				if err != nil || out.Status != guard.Acquired {
					if time.Since(began) > lease/2 {
						return true
					}
					t.Fatal(out, err)
				}
				a := out.Lease
				for _, n := range []string{"reserve", "charge"} {
					if _, err := step(bg, a, "A", n); err != nil {
						if time.Since(began) > lease/2 {
							return true
						}
						t.Fatal(err)
					}
				}
				// A dies: its lease runs out in the store.
				testenv.WaitFor(t, 10*lease, "A's lease to run out", func() bool {
					rec, err := s.Get(bg, key)
					return err == nil && rec.LeaseLeft <= 0
				})
				var got [3]string
				resume := func(ctx context.Context, l guard.Lease) ([]byte, error) {
					for i, n := range []string{"reserve", "charge", "order"} {
						v, err := step(ctx, l, "B", n)
						if err != nil {
							return nil, err
						}
						got[i] = v
					}
					// A, paused, wakes: its steps are refused.
					if _, err := step(bg, a, "A", "order"); !errors.Is(err, guard.ErrLeaseLost) {
						t.Errorf("A's late new step = %v, want ErrLeaseLost", err)
					}
					if err := s.SaveStep(bg, a, 2, guard.StepResult{Name: "order", Result: []byte(`"order by B"`)}); !errors.Is(err, guard.ErrLeaseLost) {
						t.Errorf("A's late step byte for byte B's = %v, want ErrLeaseLost", err)
					}
					rec, err := s.Get(bg, key)
					if err != nil || len(rec.Steps) != 3 || string(rec.Steps[2].Result) != `"order by B"` {
						t.Errorf("B's record %+v, %v; want its three steps, B's order", rec, err)
					}
					return []byte("done"), nil
				}
				var res guard.Result
				// Wrap's mark runs out by PostgreSQL's clock, a moment
				// after the primary's lease that Get shows: a claim in
				// between is answered in progress, and a client retries.
				retryUntil := time.Now().Add(10 * lease)
				for {
					res, err = g.Do(bg, key, "fp", resume)
					if !errors.Is(err, guard.ErrInProgress) || time.Now().After(retryUntil) {
						break
					}
					time.Sleep(5 * time.Millisecond) // a client's retry pause
				}
				if err != nil {
					if time.Since(began) > 3*lease {
						return true
					}
					t.Fatal(err)
				}
				if !res.Lease.Recovered || res.Lease.Attempt != 2 {
					t.Errorf("B's lease %+v: want a recovery, attempt 2", res.Lease)
				}
				if got != [3]string{"reserve by A", "charge by A", "order by B"} {
					t.Errorf("B saw %q", got)
				}
				mu.Lock()
				defer mu.Unlock()
				// A's late "order" ran its fn: a holder without a heartbeat
				// cannot know its lease ran out (the window KeyFor covers);
				// what matters is that its result was refused.
				want := map[string]int{"A/reserve": 1, "A/charge": 1, "A/order": 1, "B/order": 1}
				if fmt.Sprint(runs) != fmt.Sprint(want) {
					t.Errorf("step runs %v, want %v", runs, want)
				}
				if keys["A/charge"] != res.Lease.KeyFor("charge") || keys["A/charge"] != guard.DownstreamKey(key, "charge") {
					t.Errorf("KeyFor differs between holders: A %s, B %s", keys["A/charge"], res.Lease.KeyFor("charge"))
				}
				if rec, err := s.Get(bg, key); err != nil || rec.State != guard.StateCompleted || rec.Steps != nil {
					t.Errorf("completed record %+v, %v; want no steps", rec, err)
				}
				return false
			})
		})
	}
}

var bg = context.Background()
