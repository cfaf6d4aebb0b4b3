package guard_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestReleasedMarkerKeptAMinute: a RedisStore keeps the marker a first
// attempt's release leaves for a minute (scripts/release.lua), not for
// what was left of the released claim's lease and retention: a release
// sent again (go-redis resends a script whose reply was lost) after
// another claim took the key answers OK for that minute, even when the
// released claim's lease and retention were short.
func TestReleasedMarkerKeptAMinute(t *testing.T) {
	s, mr := miniStore(t)
	key := guard.Key{Scope: "s", ID: "released"}
	req := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Second, TTL: time.Second}
	out, err := s.Claim(bg, req)
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	a := out.Lease
	if err := s.Release(bg, a); err != nil {
		t.Fatal(err)
	}
	mr.FastForward(10 * time.Second) // past the claim's lease and retention, within the minute
	req.Token = "B"
	if out, err := s.Claim(bg, req); err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 1 {
		t.Fatalf("claim after the release = %+v, %v; want a first attempt", out, err)
	}
	if err := s.Release(bg, a); err != nil {
		t.Fatalf("the release sent again after B took the key = %v, want OK", err)
	}
	if rec, err := s.Get(bg, key); err != nil || rec.Token != "B" || rec.State != guard.StatePending {
		t.Fatalf("record after the retried release = %+v, %v; want B's pending record", rec, err)
	}
}
