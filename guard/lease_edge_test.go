package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestLeaseEdge: claim.lua judges a pending record's lease by the
// server's clock alone, lease left = PTTL − retention (docs/design.md, "The
// lease lives in the TTL"): with one millisecond left the holder still
// holds the key (IN_PROGRESS, 1ms left), and with none left the next claim
// takes it over (recovered, fence 2). On miniredis, whose clock stands
// still, so the edge is exact. (A mutation review: claim.lua judging a
// lease with 1ms left as run out, or one with 0ms left as alive, passed
// every test.)
func TestLeaseEdge(t *testing.T) {
	s, mr := miniStore(t)
	key := guard.Key{Scope: "s", ID: "lease-edge"}
	req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	if out, err := s.Claim(bg, req); err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim A = %+v, %v", out, err)
	}
	name := s.Name(key)
	req.Token = "B"

	mr.SetTTL(name, time.Hour+time.Millisecond) // 1ms of A's lease left
	out, err := s.Claim(bg, req)
	if err != nil || out.Status != guard.InProgress || out.LeaseLeft != time.Millisecond {
		t.Fatalf("claim B with 1ms of A's lease left = %+v, %v; want in progress, 1ms left", out, err)
	}
	if rec, err := s.Get(bg, key); err != nil || rec.Token != "A" || rec.Fence != 1 {
		t.Fatalf("record after B's claim = %+v, %v; want A's, fence 1", rec, err)
	}

	mr.SetTTL(name, time.Hour) // A's lease ends now: only the retention is left
	out, err = s.Claim(bg, req)
	if err != nil || out.Status != guard.Acquired || !out.Lease.Recovered || out.Lease.Fence != 2 {
		t.Fatalf("claim B as A's lease ends = %+v, %v; want acquired, recovered, fence 2", out, err)
	}
}

// TestFailHolderLeaseEdge: an operator's release without force
// (FailHolder, fail.lua 'stale') judges "its lease run out" as claim.lua
// does, lease left = PTTL − retention: with 1ms left it leaves the holder
// alone (an *InProgressError), with none left it fails the attempt. A
// stale release refused at the moment a claim would take the key over
// leaves the operator told the holder is alive when the key is free.
// (A mutation review: fail.lua judging a lease with 0ms left alive, and
// one with 1ms left run out, passed every test.)
func TestFailHolderLeaseEdge(t *testing.T) {
	s, mr := miniStore(t)
	key := guard.Key{Scope: "s", ID: "failholder-edge"}
	out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim A = %+v, %v", out, err)
	}
	name := s.Name(key)
	mr.SetTTL(name, time.Hour+time.Millisecond) // 1ms of A's lease left
	var inProgress *guard.InProgressError
	if err := s.FailHolder(bg, out.Lease, "released by an operator", time.Hour, false); !errors.As(err, &inProgress) {
		t.Fatalf("FailHolder with 1ms of the lease left = %v, want an *InProgressError", err)
	}
	mr.SetTTL(name, time.Hour) // A's lease ends now
	if err := s.FailHolder(bg, out.Lease, "released by an operator", time.Hour, false); err != nil {
		t.Fatalf("FailHolder as the lease ends = %v, want nil", err)
	}
	if rec, err := s.Get(bg, key); err != nil || rec.State != guard.StateFailed || rec.LastError != "released by an operator" {
		t.Fatalf("record = %+v, %v; want failed by the operator", rec, err)
	}
}
