package fallback_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestHolderWriteWhileBreakerOpen: a holder claimed through Redis; Redis
// stalls (here: dies and comes back with its data) long enough to open
// the breaker, and is back when the holder ends its claim, the breaker
// still open. The holder's Complete, Fail, Release, Extend or SaveStep
// must reach Redis:
// refused without a try, the write was lost however soon Redis was back,
// the claim stayed pending for its lease and a retry then ran the effect
// again (a completion lost) or waited a lease for nothing. Claims and
// reads are still refused without a call (TestBreaker).
func TestHolderWriteWhileBreakerOpen(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	rs := guard.NewRedisStore(c, guard.RedisOptions{Prefix: testenv.Prefix(t)})
	s := newStore(t, rs, fallback.Options{FailuresToOpen: 1, OpenTimeout: time.Hour, Timeout: 3 * time.Second, Logger: quiet})
	g := guard.New(s, guard.Options{Lease: time.Minute})
	leases := map[string]guard.Lease{}
	for _, end := range []string{"complete", "fail", "release", "extend", "step"} {
		out, err := g.Claim(bg, key(t.Name()+"/"+end), "fp")
		if err != nil || out.Status != guard.Acquired {
			t.Fatalf("claim: %+v, %v", out, err)
		}
		leases[end] = out.Lease
	}
	srv.Kill()
	openBreaker(t, s)
	srv.Restart() // with its data (append-only file)
	for end, l := range leases {
		if rec, err := rs.Get(bg, l.Key); err != nil || rec.State != guard.StatePending {
			t.Fatalf("%s: Redis came back with %+v, %v; want the holder's pending record", end, rec, err)
		}
	}
	if _, err := s.Claim(bg, claimReq("other", "T")); !errors.Is(err, fallback.ErrBreakerOpen) {
		t.Fatalf("claim with the breaker open = %v, want ErrBreakerOpen", err)
	}

	if err := g.Complete(bg, leases["complete"], []byte("paid")); err != nil {
		t.Errorf("complete with the breaker open, Redis back: %v", err)
	}
	if err := g.Fail(bg, leases["fail"], errors.New("declined")); err != nil {
		t.Errorf("fail with the breaker open, Redis back: %v", err)
	}
	if err := g.Release(bg, leases["release"]); err != nil {
		t.Errorf("release with the breaker open, Redis back: %v", err)
	}
	if err := s.Extend(bg, leases["extend"], 2*time.Minute); err != nil {
		t.Errorf("extend with the breaker open, Redis back: %v", err)
	}
	if err := s.SaveStep(bg, leases["step"], 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}); err != nil {
		t.Errorf("step with the breaker open, Redis back: %v", err)
	}
	if rec, err := rs.Get(bg, leases["extend"].Key); err != nil || rec.LeaseLeft <= time.Minute {
		t.Errorf("extended key in Redis: %+v, %v; want more than the first minute of lease left", rec, err)
	}
	if rec, err := rs.Get(bg, leases["step"].Key); err != nil || len(rec.Steps) != 1 {
		t.Errorf("stepped key in Redis: %+v, %v; want its step", rec, err)
	}
	if rec, err := rs.Get(bg, leases["complete"].Key); err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "paid" {
		t.Errorf("completed key in Redis: %+v, %v; want completed with the holder's result", rec, err)
	}
	if rec, err := rs.Get(bg, leases["fail"].Key); err != nil || rec.State != guard.StateFailed {
		t.Errorf("failed key in Redis: %+v, %v; want failed", rec, err)
	}
	if _, err := rs.Get(bg, leases["release"].Key); !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("released key in Redis: %v; want none", err)
	}
	if st := s.State(); st != fallback.StateOpen {
		t.Errorf("breaker %v after the holders' writes, want still open (they are not probes)", st)
	}
}

// TestHolderEndWhileBreakerOpenEndsMark: with no secondary (FailClosed), a
// holder claimed through backstop.Wrap; Redis dies and comes back empty
// while the breaker is open, and the holder fails or releases its claim.
// That reaches Wrap, which ends its mark's lease, so the next claim of the
// key is not told it is in progress for the rest of a lease nobody holds.
func TestHolderEndWhileBreakerOpenEndsMark(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"fail", "release"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			p := newPrimary(t)
			_, db := pgStore(t)
			b, err := backstop.New(db, pgstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			wrapped := backstop.Wrap(p.store, b)
			s := newStore(t, wrapped, fallback.Options{FailuresToOpen: 1, OpenTimeout: time.Hour,
				Timeout: 5 * time.Second, Logger: quiet})
			g := guard.New(s, guard.Options{Lease: time.Minute})
			k := key(t.Name())
			out, err := g.Claim(bg, k, "fp")
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim: %+v, %v", out, err)
			}
			p.srv.Kill()
			openBreaker(t, s)
			p.srv.Restart() // empty
			switch end {
			case "fail":
				err = g.Fail(bg, out.Lease, errors.New("declined"))
			default:
				err = g.Release(bg, out.Lease)
			}
			if err != nil && !errors.Is(err, guard.ErrLeaseLost) { // Redis came back without the record
				t.Errorf("%s with the breaker open: %v", end, err)
			}
			// The next claim (the breaker closed by then): the key is free.
			again, err := guard.New(wrapped, guard.Options{Lease: time.Minute}).Claim(bg, k, "fp")
			if err != nil || again.Status != guard.Acquired {
				t.Fatalf("claim after the holder's %s = %+v, %v; want the key at once", end, again, err)
			}
		})
	}
}

// TestHolderWriteWhileHalfOpenIsNoProbe: a holder's write reaches the
// primary in every state of the breaker, and while the breaker is not
// closed it is not counted (holderWrite): in the half-open breaker it must
// not take the probe slot that Options.HalfOpenProbes keeps for claims,
// nor close or open the breaker by its answer. Here the primary is still
// dead: a holder's write counted as the probe would open the breaker
// again on its failure, and a claim arriving meanwhile found no slot.
func TestHolderWriteWhileHalfOpenIsNoProbe(t *testing.T) {
	t.Parallel()
	p := newPrimary(t)
	s := newStore(t, p.store, fallback.Options{FailuresToOpen: 1, OpenTimeout: 100 * time.Millisecond,
		HalfOpenProbes: 1, Timeout: 3 * time.Second, Logger: quiet})
	g := guard.New(s, guard.Options{Lease: time.Minute})
	out, err := g.Claim(bg, key(t.Name()), "fp")
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim: %+v, %v", out, err)
	}
	p.srv.Kill()
	openBreaker(t, s)
	waitFor(t, 5*time.Second, "half-open", func() bool { return s.State() == fallback.StateHalfOpen })
	if err := g.Complete(bg, out.Lease, []byte("paid")); !isUnavailable(err) {
		t.Fatalf("complete on the dead primary = %v, want ErrUnavailable", err)
	}
	if st := s.State(); st != fallback.StateHalfOpen {
		t.Fatalf("breaker %v after a holder's write while half-open, want still half-open (it is no probe)", st)
	}
	// The probe slot is still there for a claim: on the primary back, it
	// closes the breaker.
	p.srv.Restart()
	if out, err := s.Claim(bg, claimReq("after", "T")); err != nil || out.Status != guard.Acquired {
		t.Fatalf("probe claim = %+v, %v; want acquired", out, err)
	}
	if st := s.State(); st != fallback.StateClosed {
		t.Fatalf("breaker %v after the probe, want closed", st)
	}
}
