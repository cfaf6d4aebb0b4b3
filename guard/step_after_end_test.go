package guard_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestStepAfterClaimEnded: once the holder itself ended its claim
// (Held.Complete, Held.Fail, Held.Release, Guard.Complete/Fail/Release of
// a Claim's lease, Do returning), the guard knows it holds the key no
// longer, and a Step asked on that lease must not run its fn: the step's
// effect (a charge) would be made by a holder that gave the key up,
// beside the next holder's run of the same step, and only the store's
// refusal of its result comes after. Today Step runs fn whenever the
// context it is given is live (a goroutine the handler left behind, or
// a context.WithoutCancel so that "the charge is not cut off midway"),
// and learns only from SaveStep that the lease is gone. Real Redis.
func TestStepAfterClaimEnded(t *testing.T) {
	s := realStore(t)
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	var ran atomic.Int64
	charge := func(context.Context) (string, error) { ran.Add(1); return "ch", nil }
	check := func(t *testing.T, what string, l guard.Lease) {
		t.Helper()
		before := ran.Load()
		_, err := guard.Step(context.Background(), l, "charge", charge)
		if n := ran.Load() - before; n != 0 || !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("%s: Step on the ended claim's lease ran fn %d times and answered %v; want it not run, ErrLeaseLost", what, n, err)
		}
	}
	key := func(id string) guard.Key {
		return guard.Key{Scope: "steps-ended", ID: id + "/" + time.Now().Format(time.RFC3339Nano)}
	}

	t.Run("Held.Release, then another holder", func(t *testing.T) {
		k := key("release")
		_, a, err := g.Hold(bg, k, "fp")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := guard.Step(a.Context(), a.Lease(), "reserve", func(context.Context) (string, error) { return "r", nil }); err != nil {
			t.Fatal(err)
		}
		if err := a.Release(); err != nil { // the request was interrupted: give the key back
			t.Fatal(err)
		}
		out, b, err := g.Hold(bg, k, "fp")
		if err != nil || out.Lease.Attempt != 2 || len(out.Steps) != 1 {
			t.Fatalf("next holder: %+v, %v", out, err)
		}
		defer func() { _ = b.Release() }()
		check(t, "after Held.Release, the key held by another", a.Lease())
	})
	t.Run("Held.Complete", func(t *testing.T) {
		_, a, err := g.Hold(bg, key("complete"), "fp")
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Complete([]byte("done")); err != nil {
			t.Fatal(err)
		}
		check(t, "after Held.Complete", a.Lease())
	})
	t.Run("Held.Fail", func(t *testing.T) {
		_, a, err := g.Hold(bg, key("fail"), "fp")
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Fail(errors.New("boom")); err != nil {
			t.Fatal(err)
		}
		check(t, "after Held.Fail", a.Lease())
	})
	t.Run("Guard.Complete of a Claim", func(t *testing.T) {
		out, err := g.Claim(bg, key("claim"), "fp")
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Complete(bg, out.Lease, []byte("done")); err != nil {
			t.Fatal(err)
		}
		check(t, "after Guard.Complete", out.Lease)
	})
	t.Run("DoBatch returned", func(t *testing.T) {
		var kept guard.Lease
		res := g.DoBatch(bg, []guard.BatchItem{{Key: key("batch"), Fingerprint: "fp"}}, func(_ context.Context, _ int, l guard.Lease) ([]byte, error) {
			kept = l // a goroutine of the effect keeps it
			return []byte("v"), nil
		}, guard.BatchOptions{})
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		check(t, "after DoBatch returned", kept)
	})
	t.Run("Do returned", func(t *testing.T) {
		res, err := g.Do(bg, key("do"), "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("v"), nil })
		if err != nil {
			t.Fatal(err)
		}
		check(t, "after Do returned (Result.Lease)", res.Lease)
	})
}
