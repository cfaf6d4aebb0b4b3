package pgstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// retentionStores are the stores the retention tests run on: the rules they check
// are the contract's, memstore shows them kept by another store.
func retentionStores(t *testing.T) map[string]guard.Store {
	return map[string]guard.Store{
		"memstore": memstore.New(memstore.Options{}),
		"pgstore":  pgenv.Store(t, pgenv.Migrated(t, pgstore.Options{}), pgstore.Options{}),
	}
}

func retentionClaim(t *testing.T, s guard.Store, r guard.ClaimRequest) guard.Lease {
	t.Helper()
	out, err := s.Claim(ctx, r)
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim %s by %s = %+v, %v; want acquired", r.Key, r.Token, out, err)
	}
	return out.Lease
}

// TestClaimAfterRetentionForgetsTheRecord: a claim made after a
// record's retention passed starts the key afresh (a first attempt, not
// recovered), and the record says so: nothing of the forgotten key's
// record is left in the new one, not its Recovered flag, not its result,
// not its last error, and the same claim sent again gets the first answer.
// (a mutation review: pgstore's reset that kept recovered, result or
// last_error of the forgotten row passed every test.)
func TestClaimAfterRetentionForgetsTheRecord(t *testing.T) {
	t.Parallel()
	for name, s := range retentionStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			req := func(key guard.Key, tok string) guard.ClaimRequest {
				return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: 100 * time.Millisecond, TTL: time.Hour}
			}
			fresh := func(what string, key guard.Key, r guard.ClaimRequest) {
				t.Helper()
				l := retentionClaim(t, s, r)
				if l.Attempt != 1 || l.Recovered {
					t.Fatalf("%s: claim after retention = %+v, want a first attempt, not recovered", what, l)
				}
				rec, err := s.Get(ctx, key)
				if err != nil {
					t.Fatalf("%s: Get: %v", what, err)
				}
				if rec.State != guard.StatePending || rec.Token != r.Token || rec.Attempt != 1 || rec.Recovered ||
					rec.Result != nil || rec.LastError != "" || len(rec.Steps) != 0 {
					t.Errorf("%s: record after the claim = %+v; want pending for %s, attempt 1, not recovered, no result, no last error",
						what, rec, r.Token)
				}
				if again := retentionClaim(t, s, r); again != l {
					t.Errorf("%s: the same claim again = %+v, want the first answer %+v", what, again, l)
				}
			}

			// A recovered key, completed: its retention passes.
			done := guard.Key{Scope: "retention", ID: "reset-completed"}
			retentionClaim(t, s, req(done, "A"))
			// A failed key: its retention passes.
			failed := guard.Key{Scope: "retention", ID: "reset-failed"}
			a := retentionClaim(t, s, req(failed, "A"))
			if err := s.Fail(ctx, a, "boom", time.Millisecond); err != nil {
				t.Fatal(err)
			}
			storetest.Wait(t, 100*time.Millisecond) // A's lease on done runs out
			b := retentionClaim(t, s, req(done, "B"))
			if !b.Recovered {
				t.Fatalf("claim after A's lease ran out = %+v, want recovered", b)
			}
			if err := s.Complete(ctx, b, []byte("b"), time.Millisecond); err != nil {
				t.Fatal(err)
			}
			storetest.Wait(t, time.Millisecond) // both records' retention passes
			for _, key := range []guard.Key{done, failed} {
				if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrNotFound) {
					t.Fatalf("Get(%s) after retention = %v, want ErrNotFound", key, err)
				}
			}
			fresh("after a recovered completion", done, req(done, "C"))
			fresh("after a failure", failed, req(failed, "C"))
		})
	}
}

// TestFormerLifeHolderLost: a holder whose record's retention passed
// (it died, or it completed) holds nothing once a new claim took the key
// afresh: its Fail and Release answer ErrLeaseLost and change nothing.
// Neither ended that claim (ptok): answering OK tells it a failure or
// release happened that did not. (a mutation review: pgstore's reset that
// recorded every former token as ptok passed every test.)
func TestFormerLifeHolderLost(t *testing.T) {
	t.Parallel()
	for name, s := range retentionStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			short := func(key guard.Key, tok string) guard.ClaimRequest {
				return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: 100 * time.Millisecond, TTL: 100 * time.Millisecond}
			}
			dead := guard.Key{Scope: "retention", ID: "former-life-dead"}
			done := guard.Key{Scope: "retention", ID: "former-life-done"}
			aDead := retentionClaim(t, s, short(dead, "A"))
			aDone := retentionClaim(t, s, short(done, "A"))
			if err := s.Complete(ctx, aDone, []byte("a"), time.Millisecond); err != nil {
				t.Fatal(err)
			}
			storetest.Wait(t, 200*time.Millisecond) // the dead holder's lease and retention pass, and the completion's
			for _, tc := range []struct {
				what string
				key  guard.Key
				a    guard.Lease
			}{{"dead holder", dead, aDead}, {"completer", done, aDone}} {
				r := short(tc.key, "B")
				r.Lease, r.TTL = time.Hour, time.Hour
				b := retentionClaim(t, s, r)
				if b.Attempt != 1 || b.Recovered {
					t.Fatalf("%s: claim after retention = %+v, want a first attempt", tc.what, b)
				}
				before, err := s.Get(ctx, tc.key)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Fail(ctx, tc.a, "late", time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
					t.Errorf("%s: Fail from the forgotten key's holder = %v, want ErrLeaseLost", tc.what, err)
				}
				if err := s.Release(ctx, tc.a); !errors.Is(err, guard.ErrLeaseLost) {
					t.Errorf("%s: Release from the forgotten key's holder = %v, want ErrLeaseLost", tc.what, err)
				}
				after, err := s.Get(ctx, tc.key)
				if err != nil || after.State != guard.StatePending || after.Token != "B" || after.Fence != before.Fence ||
					after.Attempt != 1 || after.LastError != "" {
					t.Errorf("%s: record after the former holder's writes = %+v, %v; want B's pending first attempt as before: %+v",
						tc.what, after, err, before)
				}
			}
		})
	}
}
