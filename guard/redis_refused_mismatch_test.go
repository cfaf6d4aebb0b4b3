package guard_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
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
