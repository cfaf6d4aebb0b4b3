package proof

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// TestStepStoresFollowModel: every StepStore, and the wrappers that
// forward SaveStep, answer each step call as the model (stepSteps) does,
// one call at a time: the holder's step sent again is OK and changes
// nothing; another step at its index, or a step past the end, is ORDER;
// a caller that does not hold the key (never held it, failed, released,
// completed, taken over) is LOST whatever it sends, a step byte for byte
// one the record holds included (its own, or its successor's); a step of
// an absent key is LOST. The model's porcupine check reads the history,
// so a store that answers otherwise than the model fails here, as the
// model would be wrong for it in the nemesis runs.
func TestStepStoresFollowModel(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	stores := []struct {
		name string
		open func(t *testing.T) guard.Store
	}{
		{"redis", func(t *testing.T) guard.Store { return guardenv.Store(t, guard.RedisOptions{}) }},
		{"redis-cluster", func(t *testing.T) guard.Store {
			return guardenv.StoreOn(t, testenv.Cluster(t), guard.RedisOptions{})
		}},
		{"memstore", func(t *testing.T) guard.Store { return memstore.New(memstore.Options{}) }},
		{"pgstore", func(t *testing.T) guard.Store {
			return pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
		}},
		{"fallback", func(t *testing.T) guard.Store {
			s, err := fallback.New(guardenv.Store(t, guard.RedisOptions{}), fallback.Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}},
		{"backstop", func(t *testing.T) guard.Store {
			b, err := backstop.New(pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			return backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			rec := NewRecorder(st.open(t))
			stepsAsModel(t, rec)
			h := rec.History()
			if res, viz, err := Check(h, 10*time.Second); res != porcupine.Ok {
				t.Fatalf("%s: history not linearizable against the model (%v, %v): %s\n%s", st.name, res, err, viz, Explain(h, 10*time.Second))
			}
		})
	}
}

// stepsAsModel makes the step calls of TestStepStoresFollowModel through
// rec, one at a time, and checks the answers that matter most directly.
func stepsAsModel(t *testing.T, rec *Recorder) {
	ctx := context.Background()
	run := testenv.Prefix(t)
	key := func(id string) guard.Key { return guard.Key{Scope: "steps-model", ID: run + id} }
	step := func(name, v string) guard.StepResult { return guard.StepResult{Name: name, Result: []byte(v)} }
	claim := func(k guard.Key, tok string, lease time.Duration) guard.Outcome {
		t.Helper()
		out, err := rec.Claim(ctx, guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: lease, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %s by %s: %+v, %v", k, tok, out, err)
		}
		return out
	}
	save := func(what string, l guard.Lease, i int, s guard.StepResult, want error) {
		t.Helper()
		err := rec.SaveStep(ctx, l, i, s)
		if (want == nil) != (err == nil) || want != nil && !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	lost, order := guard.ErrLeaseLost, guard.ErrStepOrder

	k := key("k1")
	a := claim(k, "A", time.Minute).Lease
	save("A's first step", a, 0, step("a", "1"), nil)
	save("A's first step sent again", a, 0, step("a", "1"), nil)
	save("A's other step at 0", a, 0, step("a", "2"), order)
	save("A's step past the end", a, 2, step("x", "1"), order)
	stranger := guard.Lease{Key: k, Token: "S"}
	save("a stranger's step byte for byte A's", stranger, 0, step("a", "1"), lost)
	save("a stranger's next step", stranger, 1, step("b", "1"), lost)
	if err := rec.Fail(ctx, a, "boom", time.Hour); err != nil {
		t.Fatal(err)
	}
	save("failed A's own step sent again", a, 0, step("a", "1"), lost)
	save("failed A's next step", a, 1, step("b", "1"), lost)
	b := claim(k, "B", time.Minute)
	if len(b.Steps) != 1 {
		t.Fatalf("B's claim reports steps %+v, want A's", b.Steps)
	}
	save("B's step", b.Lease, 1, step("b", "1"), nil)
	save("A's step byte for byte B's", a, 1, step("b", "1"), lost)
	save("A's own step sent again under B", a, 0, step("a", "1"), lost)
	if err := rec.Release(ctx, b.Lease); err != nil {
		t.Fatal(err)
	}
	save("released B's own step sent again", b.Lease, 1, step("b", "1"), lost)
	c := claim(k, "C", time.Minute)
	save("C's step sent as B's was", c.Lease, 1, step("b", "1"), nil)
	if err := rec.Complete(ctx, c.Lease, []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	save("completed C's step", c.Lease, 0, step("a", "1"), lost)
	save("completed C's next step", c.Lease, 2, step("c", "1"), lost)
	if _, err := rec.Get(ctx, k); err != nil {
		t.Fatal(err)
	}

	// A holder whose lease ran out, the key taken over.
	k2 := key("k2")
	a2 := claim(k2, "A", 50*time.Millisecond).Lease
	save("A's step", a2, 0, step("a", "1"), nil)
	var b2 guard.Outcome
	testenv.WaitFor(t, 10*time.Second, "A's lease to run out", func() bool {
		out, err := rec.Claim(ctx, guard.ClaimRequest{Key: k2, Token: "B", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		b2 = out
		return err == nil && out.Status == guard.Acquired
	})
	save("B's step", b2.Lease, 1, step("b", "1"), nil)
	save("taken-over A's step byte for byte B's", a2, 1, step("b", "1"), lost)
	save("taken-over A's own step sent again", a2, 0, step("a", "1"), lost)
	save("B's own step sent again", b2.Lease, 1, step("b", "1"), nil)
	if _, err := rec.Get(ctx, k2); err != nil {
		t.Fatal(err)
	}

	// A holder whose lease ran out, the key not taken over: still the
	// record's holder, as for Complete (the fence guards what it does).
	k3 := key("k3")
	a3 := claim(k3, "A", 50*time.Millisecond).Lease
	testenv.WaitFor(t, 10*time.Second, "A's lease to run out", func() bool {
		r, err := rec.inner.Get(ctx, k3) // not recorded: LeaseLeft is not in the model
		return err == nil && r.LeaseLeft <= 0
	})
	save("A's step after its lease ran out, the key not taken over", a3, 0, step("a", "1"), nil)
	save("that step sent again", a3, 0, step("a", "1"), nil)

	save("a step of an absent key", guard.Lease{Key: key("absent"), Token: "A"}, 0, step("a", "1"), lost)
}
