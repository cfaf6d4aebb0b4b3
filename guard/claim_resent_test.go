package guard_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestClaimResentAfterItsEnd: a copy of a claim that reaches Redis after
// its holder ended the claim (go-redis re-sends a claim whose reply was
// lost; a delayed copy can land after the guard released it, or after
// the holder failed it) takes nothing: the failed record stays as it is,
// so the next claim takes it over with the next fence and attempt, as if
// the claim had been made once.
func TestClaimResentAfterItsEnd(t *testing.T) {
	s := realStore(t)
	req := func(id, tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: guard.Key{Scope: "resent", ID: id}, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	claim := func(t *testing.T, r guard.ClaimRequest) guard.Outcome {
		t.Helper()
		out, err := s.Claim(bg, r)
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %s: %v, %v", r.Token, out.Status, err)
		}
		return out
	}
	for _, end := range []string{"fail", "release"} {
		t.Run(end, func(t *testing.T) {
			first := claim(t, req(end, "A"))
			if err := s.Fail(bg, first.Lease, "x", time.Hour); err != nil {
				t.Fatal(err)
			}
			b := req(end, "B")
			taken := claim(t, b) // fence 2, attempt 2
			var err error
			if end == "fail" {
				err = s.Fail(bg, taken.Lease, "y", time.Hour)
			} else {
				err = s.Release(bg, taken.Lease)
			}
			if err != nil {
				t.Fatal(err)
			}
			before, err := s.Get(bg, b.Key)
			if err != nil {
				t.Fatal(err)
			}
			if out, err := s.Claim(bg, b); err != nil || out.Status != guard.InProgress {
				t.Errorf("claim B sent again after its %s: %v (fence %d attempt %d), %v; want in progress, nothing taken", end, out.Status, out.Lease.Fence, out.Lease.Attempt, err)
			}
			after, err := s.Get(bg, b.Key)
			if err != nil || after.State != before.State || after.Fence != before.Fence || after.Attempt != before.Attempt || after.Token != before.Token {
				t.Errorf("record after the copy: %+v, %v; want it as before: %+v", after, err, before)
			}
			next := claim(t, req(end, "C"))
			if next.Lease.Fence != 3 || next.Lease.Attempt != before.Attempt+1 {
				t.Errorf("next claim: fence %d attempt %d, want 3 and %d", next.Lease.Fence, next.Lease.Attempt, before.Attempt+1)
			}
		})
	}
}
