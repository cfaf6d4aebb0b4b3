package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestClaimAfterReleasedFirstAttempt: a released first attempt is
// undone "as if it had never been made" (scripts/release.lua; the memstore
// removes the record, and its next claim is a first attempt at fence 1): while its marker is kept, the next claim, which
// claim.lua answers, is the same first attempt a claim on an absent key
// gets from the native SET NX: fence 1, attempt 1, not recovered, and Get
// agrees (docs/design.md, "The state changes": claim "creates the record
// (fence 1)", claim.lua "released → a new first attempt"). The contract's
// ReleaseFirstAttempt checks the attempt but not the fence. (A mutation
// review: claim.lua taking a released marker at fence 2 passed every
// test; its fence would then depend on whether the marker's minute had
// passed.)
func TestClaimAfterReleasedFirstAttempt(t *testing.T) {
	onThreeStores(t, func(t *testing.T, s guard.Store) {
		key := guard.Key{Scope: "mut", ID: "released-first/" + t.Name()}
		req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		out, err := s.Claim(bg, req)
		if err != nil || out.Status != guard.Acquired || out.Lease.Fence != 1 {
			t.Fatalf("claim A = %+v, %v", out, err)
		}
		if err := s.Release(bg, out.Lease); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("Get after the release = %v, want ErrNotFound", err)
		}
		req.Token = "B"
		out, err = s.Claim(bg, req)
		if err != nil || out.Status != guard.Acquired || out.Lease.Fence != 1 || out.Lease.Attempt != 1 || out.Lease.Recovered {
			t.Fatalf("claim B after A's released first attempt = %+v, %v; want fence 1, attempt 1, not recovered", out, err)
		}
		if rec, err := s.Get(bg, key); err != nil || rec.Token != "B" || rec.Fence != 1 || rec.Attempt != 1 {
			t.Fatalf("record after B's claim = %+v, %v; want B's, fence 1, attempt 1", rec, err)
		}
	})
}

// TestReleasedFirstAttemptAnyFingerprint: a released first attempt
// reads as absent, so a claim with another fingerprint takes the key as a
// first attempt rather than answering Mismatch (docs/design.md, "The state
// changes": "another fingerprint → mismatch (any record but a released
// one)"; the memstore forgets the released record). The contract's
// MismatchEveryState covers every state but this one. (A mutation review:
// claim.lua answering Mismatch for a released marker of another
// fingerprint passed every test.)
func TestReleasedFirstAttemptAnyFingerprint(t *testing.T) {
	onThreeStores(t, func(t *testing.T, s guard.Store) {
		key := guard.Key{Scope: "mut", ID: "released-any-fp"}
		out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "first payload", Lease: time.Minute, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim A = %+v, %v", out, err)
		}
		if err := s.Release(bg, out.Lease); err != nil {
			t.Fatal(err)
		}
		out, err = s.Claim(bg, guard.ClaimRequest{Key: key, Token: "B", Fingerprint: "another payload", Lease: time.Minute, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 1 {
			t.Fatalf("claim B with another fingerprint after A's release = %+v, %v; want acquired, a first attempt", out, err)
		}
		if rec, err := s.Get(bg, key); err != nil || rec.Token != "B" || rec.Fingerprint != "another payload" {
			t.Fatalf("record = %+v, %v; want B's, with B's fingerprint", rec, err)
		}
	})
}
