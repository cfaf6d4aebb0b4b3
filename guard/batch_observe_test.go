package guard_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// On Redis, standalone and Cluster (and on memstore and pgstore), DoBatch answers and observes every
// claim answer as Do does for a twin key in the same state (the events,
// their attempt numbers and their order; the result, the lease's fence,
// attempt and recovery), besides those TestDoBatchObservesAsDo covers on
// miniredis: an attempt failed before (the claim script's path), a key out
// of attempts, a released key, a crashed holder's steps (the effect's
// Step answers from them), an invalid key between the others. Every lease
// it runs has its deadline and its steps.
func TestDoBatchObservesAsDoOnStores(t *testing.T) {
	for _, on := range []string{"client", "cluster", "memstore", "pgstore"} {
		t.Run(on, func(t *testing.T) {
			var s guard.StepStore
			switch on {
			case "client":
				s = guardenv.Store(t, guard.RedisOptions{})
			case "cluster":
				s = guardenv.StoreOn(t, testenv.Cluster(t), guard.RedisOptions{})
			case "memstore":
				s = memstore.New(memstore.Options{})
			default:
				s = pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
			}
			testDoBatchObservesAsDoOnStores(t, s)
		})
	}
}

func testDoBatchObservesAsDoOnStores(t *testing.T, s guard.StepStore) {
	var (
		mu     sync.Mutex
		events = map[guard.Key][]string{}
	)
	g := guard.New(s, guard.Options{Lease: 30 * time.Second, MaxAttempts: 2, Observer: guard.ObserverFunc(func(_ context.Context, e guard.Event) {
		mu.Lock()
		defer mu.Unlock()
		events[e.Key] = append(events[e.Key], fmt.Sprintf("%s %d", e.Kind, e.Attempt))
	})})
	ids := []string{"fresh", "failed", "", "exhausted", "done", "busy", "other-payload", "released", "crashed", "crashed-steps"}
	fail := func(context.Context, guard.Lease) ([]byte, error) { return nil, errors.New("boom") }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, scope := range []string{"do", "batch"} {
		k := func(id string) guard.Key { return guard.Key{Scope: scope, ID: id} }
		_, _ = g.Do(bg, k("failed"), "fp", fail)
		_, _ = g.Do(bg, k("exhausted"), "fp", fail)
		_, _ = g.Do(bg, k("exhausted"), "fp", fail)
		_, err := g.Do(bg, k("done"), "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("v"), nil })
		must(err)
		_, err = g.Claim(bg, k("busy"), "fp")
		must(err)
		_, err = g.Claim(bg, k("other-payload"), "fp")
		must(err)
		l, err := g.Claim(bg, k("released"), "fp")
		must(err)
		must(g.Release(bg, l.Lease))
		for _, id := range []string{"crashed", "crashed-steps"} {
			out, err := s.Claim(bg, guard.ClaimRequest{Key: k(id), Token: "crashed", Fingerprint: "fp", Lease: 50 * time.Millisecond, TTL: time.Hour})
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("%s: %+v, %v", id, out, err)
			}
			if id == "crashed-steps" {
				must(s.SaveStep(bg, out.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}))
			}
		}
	}
	probe := guard.ClaimRequest{Key: guard.Key{Scope: "probe", ID: testenv.Prefix(t)}, Token: "P", Lease: 50 * time.Millisecond, TTL: time.Minute}
	if _, err := s.Claim(bg, probe); err != nil {
		t.Fatal(err)
	}
	probe.Token = "P2"
	testenv.WaitFor(t, 10*time.Second, "the crashed holders' leases to run out", func() bool {
		out, err := s.Claim(bg, probe)
		return err == nil && out.Status == guard.Acquired
	})
	mu.Lock()
	clear(events)
	mu.Unlock()

	fp := func(id string) string {
		if id == "other-payload" {
			return "another fp"
		}
		return "fp"
	}
	effect := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		if lease.Deadline.IsZero() || lease.Deadline.Before(time.Now()) {
			return nil, fmt.Errorf("lease deadline %v", lease.Deadline)
		}
		return guard.Step(ctx, lease, "charge", func(context.Context) ([]byte, error) { return []byte("ran"), nil })
	}
	answer := func(res guard.Result, err error) string {
		var ex *guard.ExhaustedError
		return fmt.Sprintf("%q replayed=%v fence=%d attempt=%d recovered=%v in-progress=%v mismatch=%v exhausted=%v invalid=%v err=%v",
			res.Value, res.Replayed, res.Lease.Fence, res.Lease.Attempt, res.Lease.Recovered, errors.Is(err, guard.ErrInProgress),
			errors.Is(err, guard.ErrMismatch), errors.As(err, &ex), errors.Is(err, guard.ErrInvalidKey), err != nil)
	}
	doRes := map[string]string{}
	for _, id := range ids {
		res, err := g.Do(bg, guard.Key{Scope: "do", ID: id}, fp(id), effect)
		doRes[id] = answer(res, err)
	}
	items := make([]guard.BatchItem, len(ids))
	for i, id := range ids {
		items[i] = guard.BatchItem{Key: guard.Key{Scope: "batch", ID: id}, Fingerprint: fp(id)}
	}
	for i, r := range g.DoBatch(bg, items, func(ctx context.Context, _ int, lease guard.Lease) ([]byte, error) {
		return effect(ctx, lease)
	}, guard.BatchOptions{}) {
		id := ids[i]
		if got := answer(r.Result, r.Err); got != doRes[id] {
			t.Errorf("%q: DoBatch answered %s, Do %s", id, got, doRes[id])
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		got, want := events[guard.Key{Scope: "batch", ID: id}], events[guard.Key{Scope: "do", ID: id}]
		if !slices.Equal(got, want) {
			t.Errorf("%q: DoBatch observed %q, Do %q", id, got, want)
		}
	}
	for id, want := range map[string]string{"crashed-steps": `"ch_1" replayed=false fence=2 attempt=2 recovered=true`,
		"failed": `"ran" replayed=false fence=2 attempt=2 recovered=false`} {
		if got := doRes[id]; len(got) < len(want) || got[:len(want)] != want {
			t.Errorf("%s: Do answered %s, want %s", id, got, want)
		}
	}
}
