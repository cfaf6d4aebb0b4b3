package backstop_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestMarkDropsForgottenRowSteps: a pgstore.Store and
// backstop.Wrap on the same tables (fallback's secondary over the
// backstop's tables, as README's TestReplicaSplitOverBackstop setup has
// it). The Store's row of a key keeps that key's steps in its steps
// column. Once the row's retention has passed the key is forgotten, and a
// request that reuses the key later with another payload must start
// afresh: pgstore's own claim of the expired row drops them
// (resetExpired), and the mark's statement deletes the forgotten key's
// rows of the steps table. But the mark Wrap writes over the expired row
// kept its steps column: the next claim of the key on the Store (a Redis
// outage, the mark's lease over) answered the new payload with the
// forgotten payload's steps, so guard.Step would hand it the other
// request's step result (a charge it never made) without running it.
func TestMarkDropsForgottenRowSteps(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	st := pgenv.Store(t, db, pgstore.Options{})
	w := backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)
	key := newKey(t)
	req := func(tok, fp string, lease, ttl time.Duration) guard.ClaimRequest {
		return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: lease, TTL: ttl}
	}
	// The first request, on the Store: a step, then it fails; its row is
	// kept 300 ms.
	a, err := st.Claim(ctx, req("A", "first payload", time.Minute, 300*time.Millisecond))
	if err != nil || a.Status != guard.Acquired {
		t.Fatal(a, err)
	}
	if err := st.SaveStep(ctx, a.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_of_the_first_payload")}); err != nil {
		t.Fatal(err)
	}
	if err := st.Fail(ctx, a.Lease, "declined later", 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the key's retention to pass", func() bool {
		_, err := st.Get(ctx, key)
		return errors.Is(err, guard.ErrNotFound)
	})
	// Much later the key is reused for another payload, through Wrap:
	// Redis has no record, the backstop marks the holder over the
	// expired row. Its lease is short.
	out, err := w.Claim(ctx, req("B", "second payload", 200*time.Millisecond, time.Hour))
	if err != nil || out.Status != guard.Acquired || len(out.Steps) != 0 {
		t.Fatalf("claim of the reused key through Wrap = %+v, %v; want acquired, no steps", out, err)
	}
	if rec, err := st.Get(ctx, key); err == nil && len(rec.Steps) > 0 {
		t.Errorf("the mark of the second payload's holder holds the forgotten payload's steps: %q = %q",
			rec.Steps[0].Name, rec.Steps[0].Result)
	}
	// Redis goes away (a fallback's secondary takes over): the Store's
	// claim of the key once the mark's lease is over.
	var c guard.Outcome
	testenv.WaitFor(t, 10*time.Second, "the mark's lease to run out", func() bool {
		c, err = st.Claim(ctx, req("C", "second payload", time.Minute, time.Hour))
		return err != nil || c.Status != guard.InProgress
	})
	if err != nil || c.Status != guard.Acquired {
		t.Fatalf("the Store's claim = %+v, %v", c, err)
	}
	if len(c.Steps) > 0 {
		t.Errorf("the second payload's claim on the Store got the forgotten first payload's steps: %q = %q (guard.Step would not run its charge)",
			c.Steps[0].Name, c.Steps[0].Result)
	}
}
