package guard_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestNoReplicasStillMismatches: on a server refusing writes (here a
// primary without the replicas min-replicas-to-write asks for; OOM and
// MISCONF refuse the same way) the native SET NX GET fails and the claim
// script answers every claim, a done key's too. A claim under that key
// with another fingerprint is still a mismatch that learns nothing of the
// stored result, through Claim and ClaimBatch, as it is when the client
// answers from the record itself. (The script meets a completed record on
// a healthy server too: when the holder completes between a claim's SET
// NX GET, which found its pending record, and the script.)
func TestNoReplicasStillMismatches(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{})
	done := guard.Key{Scope: "s", ID: "done"}
	req := func(fp string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: done, Token: "B", Fingerprint: fp, Lease: time.Minute, TTL: time.Hour}
	}
	out, err := s.Claim(bg, guard.ClaimRequest{Key: done, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	if err := s.Complete(bg, out.Lease, []byte("secret"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := srv.Client().ConfigSet(bg, "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if out, err := s.Claim(bg, req("fp")); err != nil || out.Status != guard.Replay || string(out.Result) != "secret" {
		t.Fatalf("claim with the same fingerprint = %+v, %v; want a replay of the result", out, err)
	}
	if out, err := s.Claim(bg, req("other")); err != nil || out.Status != guard.Mismatch || out.Result != nil {
		t.Errorf("claim with another fingerprint = %+v, %v; want a mismatch without the result", out, err)
	}
	outs, errs := s.ClaimBatch(bg, []guard.ClaimRequest{req("other")})
	if errs[0] != nil || outs[0].Status != guard.Mismatch || outs[0].Result != nil {
		t.Errorf("batch claim with another fingerprint = %+v, %v; want a mismatch without the result", outs[0], errs[0])
	}
}

// TestNoReplicasRetriedClaimSameAnswer: a claim sent again by the holder
// that recovered a key (go-redis resends a call whose reply was lost)
// gets the answer the claim got, Recovered included, when the claim
// script answers it: on a server refusing writes, where the native SET NX
// GET fails.
func TestNoReplicasRetriedClaimSameAnswer(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{})
	req := guard.ClaimRequest{Key: guard.Key{Scope: "s", ID: "recovered"}, Token: "A", Fingerprint: "fp", Lease: 200 * time.Millisecond, TTL: time.Hour}
	if out, err := s.Claim(bg, req); err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	storetest.Wait(t, req.Lease) // A stops heartbeating: it crashed
	req.Token, req.Lease = "B", time.Minute
	first, err := s.Claim(bg, req)
	if err != nil || first.Status != guard.Acquired || !first.Lease.Recovered || first.Lease.Fence != 2 {
		t.Fatalf("recovering claim = %+v, %v", first, err)
	}
	if err := srv.Client().ConfigSet(bg, "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	again, err := s.Claim(bg, req)
	if err != nil || again.Status != guard.Acquired || again.Lease.Fence != 2 || again.Lease.Attempt != 2 || !again.Lease.Recovered {
		t.Fatalf("the recovering claim sent again = %+v, %v; want fence 2, attempt 2, recovered", again, err)
	}
}
