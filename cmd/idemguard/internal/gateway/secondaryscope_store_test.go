package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestScopedSecondaryContract: the gateway's secondary, keys kept under
// its prefix, is a guard.Store (steps included) as pgstore's Store is,
// with an older version's rows being looked for on every claim.
func TestScopedSecondaryContract(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T) guard.Store {
			s := newScopedSecondary(pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{}), "svc-a:")
			s.honourLegacy(time.Now().Add(time.Hour))
			return s
		},
		Advance:              storetest.Wait,
		Parallel:             true,
		Keys:                 100,
		Duplicates:           4,
		FencesOutliveRecords: true, // pgstore's
	})
}

// TestScopedSecondaryOlderRows: a claim in the gateway's secondary answers
// an older version's row (under the bare scope) as pgstore answered it
// then, while such rows live: another fingerprint is a mismatch, a live
// holder is in progress, spent attempts are exhausted. Past their time,
// the key is the gateway's own, fresh.
func TestScopedSecondaryOlderRows(t *testing.T) {
	ctx := context.Background()
	pg := pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{})
	claim := func(st guard.Store, id, token, fp string) guard.Outcome {
		t.Helper()
		out, err := st.Claim(ctx, guard.ClaimRequest{Key: guard.Key{Scope: `"acct9" POST /orders`, ID: id},
			Token: token, Fingerprint: fp, Lease: time.Hour, TTL: time.Hour, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// What the older version wrote.
	claim(pg, "held", "old", "fp")
	if out := claim(pg, "failed", "old", "fp"); out.Status != guard.Acquired {
		t.Fatal(out.Status)
	} else if err := pg.Fail(ctx, out.Lease, "upstream down", time.Hour); err != nil {
		t.Fatal(err)
	}

	s := newScopedSecondary(pg, "svc-a:")
	s.honourLegacy(time.Now().Add(time.Hour))
	for id, want := range map[string]guard.Status{"held": guard.InProgress, "failed": guard.Exhausted} {
		if out := claim(s, id, "new", "fp"); out.Status != want {
			t.Errorf("%s: %s, want %s as the older version's row says", id, out.Status, want)
		}
		if out := claim(s, id, "new", "other"); out.Status != guard.Mismatch {
			t.Errorf("%s with another fingerprint: %s, want mismatch", id, out.Status)
		}
	}
	if _, err := pg.Get(ctx, guard.Key{Scope: SecondaryScope("svc-a:", `"acct9" POST /orders`), ID: "held"}); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("a claim answered from the older row wrote one of its own: %v", err)
	}

	fresh := newScopedSecondary(pg, "svc-a:") // no older row live (the start-up check found none)
	if out := claim(fresh, "held", "new", "other"); out.Status != guard.Acquired || out.Lease.Key.Scope != `"acct9" POST /orders` {
		t.Fatalf("%s under %q, want acquired under the scope as given", out.Status, out.Lease.Key.Scope)
	}
}
