package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// TestFailHolderResent: an operator's FailHolder (idemguard release) sent
// again after its reply was lost (go-redis re-sends a script) answers as
// its first copy did, OK: the first copy failed the holder, and the
// record keeps its token and the operator's reason. fail.lua answered an
// operator's copy LOST on a failed record, and the CLI then said the key
// "changed while releasing; nothing done" though its own release had
// ended it. A record the holder failed itself, with its own reason, is
// still refused.
func TestFailHolderResent(t *testing.T) {
	s := realStore(t)
	const why = "released by an operator"
	for _, force := range []bool{true, false} {
		name := map[bool]string{true: "force", false: "stale"}[force]
		t.Run(name, func(t *testing.T) {
			key := guard.Key{Scope: "failholder-resent", ID: name}
			lease := 50 * time.Millisecond
			if force {
				lease = time.Minute
			}
			out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "HOLDER", Fingerprint: "fp", Lease: lease, TTL: time.Hour})
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim: %+v, %v", out, err)
			}
			if !force {
				testenv.WaitFor(t, 10*time.Second, "the holder's lease to run out", func() bool {
					rec, err := s.Get(bg, key)
					return err == nil && rec.LeaseLeft == 0
				})
			}
			holder := guard.Lease{Key: key, Token: "HOLDER"}
			for copyN := 1; copyN <= 2; copyN++ {
				if err := s.FailHolder(bg, holder, why, time.Hour, force); err != nil {
					t.Fatalf("FailHolder, copy %d: %v; want OK, as the first copy answered", copyN, err)
				}
			}
			if rec, err := s.Get(bg, key); err != nil || rec.State != guard.StateFailed || rec.LastError != why {
				t.Fatalf("record: %+v, %v; want failed by the operator", rec, err)
			}
		})
	}
	t.Run("holder failed it", func(t *testing.T) {
		key := guard.Key{Scope: "failholder-resent", ID: "own"}
		out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "HOLDER", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim: %+v, %v", out, err)
		}
		if err := s.Fail(bg, out.Lease, "card declined", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := s.FailHolder(bg, guard.Lease{Key: key, Token: "HOLDER"}, why, time.Hour, true); !errors.Is(err, guard.ErrLeaseLost) {
			t.Errorf("FailHolder on a record its holder failed: %v; want ErrLeaseLost (nothing done)", err)
		}
	})
}
