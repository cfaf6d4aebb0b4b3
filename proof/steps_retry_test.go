package proof

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestStepScriptsUnderRetry: step.lua, and the scripts that keep steps
// (claim, fail, release), run twice when their first reply is lost
// (go-redis sends them again): the retry answers what the first run did,
// and the record holds what one run would leave.
func TestStepScriptsUnderRetry(t *testing.T) {
	r := newRetryRig(t)
	ctx := context.Background()
	n := 0
	key := func() guard.Key { n++; return guard.Key{Scope: "step-retry", ID: strconv.Itoa(n)} }
	step := func(name, v string) guard.StepResult { return guard.StepResult{Name: name, Result: []byte(v)} }
	wantSteps := func(t *testing.T, rec guard.Record, names ...string) {
		t.Helper()
		if len(rec.Steps) != len(names) {
			t.Fatalf("record holds steps %+v, want %v", rec.Steps, names)
		}
		for i, n := range names {
			if rec.Steps[i].Name != n {
				t.Fatalf("record holds steps %+v, want %v", rec.Steps, names)
			}
		}
	}

	t.Run("first step", func(t *testing.T) {
		k := key()
		r.claim(r.plain, k, "A", time.Minute)
		if err := r.once(func() error { return r.viaP.SaveStep(ctx, guard.Lease{Key: k, Token: "A"}, 0, step("a", "1")) }, nil); err != nil {
			t.Fatalf("step: %v, want OK", err)
		}
		wantSteps(t, r.get(k), "a")
	})
	t.Run("later step", func(t *testing.T) {
		k := key()
		r.claim(r.plain, k, "A", time.Minute)
		if err := r.plain.SaveStep(ctx, guard.Lease{Key: k, Token: "A"}, 0, step("a", "1")); err != nil {
			t.Fatal(err)
		}
		if err := r.once(func() error { return r.viaP.SaveStep(ctx, guard.Lease{Key: k, Token: "A"}, 1, step("b", "2")) }, nil); err != nil {
			t.Fatalf("step: %v, want OK", err)
		}
		wantSteps(t, r.get(k), "a", "b")
	})
	t.Run("claim recovering a failed key with steps", func(t *testing.T) {
		k := key()
		r.claim(r.plain, k, "A", time.Minute)
		_ = r.plain.SaveStep(ctx, guard.Lease{Key: k, Token: "A"}, 0, step("a", "1"))
		_ = r.plain.Fail(ctx, guard.Lease{Key: k, Token: "A"}, "boom", time.Hour)
		var out guard.Outcome
		err := r.run(scriptReply, func() (err error) {
			out, err = r.viaP.Claim(ctx, guard.ClaimRequest{Key: k, Token: "B", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
			return err
		}, nil)
		if err != nil || out.Status != guard.Acquired || out.Lease.Fence != 2 || len(out.Steps) != 1 || out.Steps[0].Name != "a" {
			t.Fatalf("claim: %+v, %v; want acquired fence 2 with step a", out, err)
		}
	})
	t.Run("fail with steps", func(t *testing.T) {
		k := key()
		r.claim(r.plain, k, "A", time.Minute)
		_ = r.plain.SaveStep(ctx, guard.Lease{Key: k, Token: "A"}, 0, step("a", "1"))
		if err := r.once(func() error { return r.viaP.Fail(ctx, guard.Lease{Key: k, Token: "A"}, "boom", time.Hour) }, nil); err != nil {
			t.Fatalf("fail: %v, want OK", err)
		}
		rec := r.get(k)
		if rec.State != guard.StateFailed {
			t.Fatalf("record %+v", rec)
		}
		wantSteps(t, rec, "a")
	})
	t.Run("release with steps", func(t *testing.T) {
		k := key()
		r.claim(r.plain, k, "A", time.Minute)
		_ = r.plain.SaveStep(ctx, guard.Lease{Key: k, Token: "A"}, 0, step("a", "1"))
		if err := r.once(func() error { return r.viaP.Release(ctx, guard.Lease{Key: k, Token: "A"}) }, nil); err != nil {
			t.Fatalf("release: %v, want OK", err)
		}
		rec := r.get(k)
		if rec.State != guard.StateFailed || rec.Attempt != 1 {
			t.Fatalf("record %+v, want failed at attempt 1", rec)
		}
		wantSteps(t, rec, "a")
	})
}

// TestStepRetryRacingRecovery: a step's reply is lost after it was
// stored, the holder's lease runs out, and another claim recovers the key
// (seeing the step) before go-redis' retry arrives. The step stays stored,
// as the recovering holder saw, and the retry answers that the caller no
// longer holds the key (ErrLeaseLost): the store cannot tell a resent
// call from a former holder's step that happens to match one the new
// holder stored, and an OK to the latter would let it past a step that
// gates an effect.
func TestStepRetryRacingRecovery(t *testing.T) {
	r := newRetryRig(t)
	ctx := context.Background()
	k := guard.Key{Scope: "step-race", ID: "1"}
	r.claim(r.plain, k, "A", 50*time.Millisecond)
	var rival guard.Outcome
	err := r.once(func() error {
		return r.viaP.SaveStep(ctx, guard.Lease{Key: k, Token: "A"}, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")})
	}, func() {
		waitLeaseOut(t, r.plain, k)
		rival = r.claim(r.plain, k, "RIVAL", time.Minute)
	})
	if rival.Status != guard.Acquired || !rival.Lease.Recovered || len(rival.Steps) != 1 || string(rival.Steps[0].Result) != "ch_1" {
		t.Fatalf("rival: %+v, want a recovery that sees the step", rival)
	}
	if !errors.Is(err, guard.ErrLeaseLost) {
		t.Fatalf("a step retried after another claim recovered the key answered %v, want ErrLeaseLost", err)
	}
	if rec := r.get(k); len(rec.Steps) != 1 || string(rec.Steps[0].Result) != "ch_1" {
		t.Fatalf("record after the retry: %+v, want the step kept", rec)
	}
}
