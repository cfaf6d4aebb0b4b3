package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// TestFailHolder: an operator's release (idemguard release) fails a
// holder's attempt in its name, and Redis judges, as it writes, what the
// operator saw when it looked: the record must still be that holder's
// pending one, and, without force, its lease run out. A holder that
// extended its lease since is left alone (its effect would otherwise run
// twice); one that ended its attempt, its key taken by another holder, is
// not reported released (a holder's own Fail answers OK there, as a retry
// of that Fail).
func TestFailHolder(t *testing.T) {
	s, mr := miniStore(t)
	claim := func(key guard.Key, tok string) guard.Lease {
		t.Helper()
		out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: time.Second, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim %s by %s = %+v, %v", key, tok, out, err)
		}
		return out.Lease
	}
	const reason = "released by an operator"

	t.Run("lease alive", func(t *testing.T) {
		a := claim(guard.Key{Scope: "s", ID: "alive"}, "A")
		var inProgress *guard.InProgressError
		if err := s.FailHolder(bg, a, reason, time.Hour, false); !errors.As(err, &inProgress) || inProgress.RetryAfter <= 0 {
			t.Fatalf("FailHolder of a live lease = %v, want an *InProgressError with the lease left", err)
		}
		if err := s.Complete(bg, a, []byte("done"), time.Hour); err != nil {
			t.Fatalf("the holder's Complete after a refused release = %v, want nil", err)
		}
	})
	t.Run("lease alive, forced", func(t *testing.T) {
		a := claim(guard.Key{Scope: "s", ID: "forced"}, "A")
		if err := s.FailHolder(bg, a, reason, time.Hour, true); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(bg, a, []byte("done"), time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("the freed holder's Complete = %v, want ErrLeaseLost", err)
		}
	})
	t.Run("lease run out", func(t *testing.T) {
		key := guard.Key{Scope: "s", ID: "stale"}
		a := claim(key, "A")
		mr.FastForward(2 * time.Second)
		if err := s.FailHolder(bg, a, reason, time.Hour, false); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(bg, a, []byte("done"), time.Hour); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("the freed holder's Complete = %v, want ErrLeaseLost", err)
		}
		if b := claim(key, "B"); b.Fence != a.Fence+1 {
			t.Fatalf("the next claim's fence %d, want %d", b.Fence, a.Fence+1)
		}
	})
	t.Run("ended and taken meanwhile", func(t *testing.T) {
		key := guard.Key{Scope: "s", ID: "taken"}
		a := claim(key, "A")
		if err := s.Fail(bg, a, "declined", time.Hour); err != nil {
			t.Fatal(err)
		}
		if err := s.FailHolder(bg, a, reason, time.Hour, true); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("FailHolder of a holder that failed itself = %v, want ErrLeaseLost", err)
		}
		claim(key, "B")
		if err := s.FailHolder(bg, a, reason, time.Hour, true); !errors.Is(err, guard.ErrLeaseLost) {
			t.Fatalf("FailHolder of a holder whose key another took = %v, want ErrLeaseLost", err)
		}
		if err := s.Fail(bg, a, "declined", time.Hour); err != nil {
			t.Fatalf("the holder's own Fail, sent again = %v, want nil (a retry's answer)", err)
		}
	})
}
