package fallback_test

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// gatedPrimary answers claims with ErrUnavailable while down, and holds a
// claim made with token hold until release is closed.
type gatedPrimary struct {
	guard.Store
	down    atomic.Bool
	hold    string
	held    chan struct{} // closed once the held claim reached the store
	release chan struct{}
}

func (g *gatedPrimary) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if g.down.Load() {
		return guard.Outcome{}, guard.ErrUnavailable
	}
	if req.Token == g.hold {
		close(g.held)
		<-g.release
	}
	return g.Store.Claim(ctx, req)
}

// waitingInClaim reports whether some goroutine is blocked in a select
// directly in fallback.(*Store).Claim: a claim waiting for the half-open
// breaker's verdict.
func waitingInClaim() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.SplitN(g, "\n", 3)
		if len(lines) >= 2 && strings.Contains(lines[0], "[select") &&
			strings.HasPrefix(lines[1], "github.com/idemguard/idemguard/fallback.(*Store).Claim(") {
			return true
		}
	}
	return false
}

// TestProbeAbandonedWakesWaiters: half-open, a probe claim takes the
// only probe slot and its caller goes away (cancelled context) while the
// primary has not answered. The breaker excludes the abandoned probe and
// frees its slot: no probe is under way, and the primary answers. A claim
// that was waiting for the probe's verdict gets the free slot. (It waited
// out Options.Timeout and was refused with ErrUnavailable, "being
// probed", while nothing was probing.)
func TestProbeAbandonedWakesWaiters(t *testing.T) {
	p := newPrimary(t)
	gp := &gatedPrimary{Store: p.store, hold: "PROBE", held: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-gp.release:
		default:
			close(gp.release)
		}
	})
	const timeout = 3 * time.Second
	s := newStore(t, gp, fallback.Options{Timeout: timeout, FailuresToOpen: 1, OpenTimeout: 50 * time.Millisecond, Logger: quiet})

	gp.down.Store(true)
	if _, err := s.Claim(bg, claimReq("open", "X")); !isUnavailable(err) {
		t.Fatalf("claim on a down primary = %v", err)
	}
	if st := s.State(); st != fallback.StateOpen {
		t.Fatalf("breaker %v, want open", st)
	}
	gp.down.Store(false)
	waitFor(t, 5*time.Second, "half-open", func() bool { return s.State() == fallback.StateHalfOpen })

	// The probe: its caller will go away before the primary answers.
	pctx, cancelProbe := context.WithCancel(bg)
	probeDone := make(chan error, 1)
	go func() {
		_, err := s.Claim(pctx, claimReq("probe", "PROBE"))
		probeDone <- err
	}()
	<-gp.held

	// A claim waiting for the probe's verdict.
	type answer struct {
		out guard.Outcome
		err error
		d   time.Duration
	}
	waiter := make(chan answer, 1)
	go func() {
		start := time.Now()
		out, err := s.Claim(bg, claimReq("waiter", "W"))
		waiter <- answer{out, err, time.Since(start)}
	}()
	waitFor(t, 5*time.Second, "the claim waiting for the probe's verdict", waitingInClaim)

	cancelProbe()
	if err := <-probeDone; err == nil {
		t.Fatalf("abandoned probe answered nil")
	}
	a := <-waiter
	if a.err != nil || a.out.Status != guard.Acquired {
		t.Fatalf("claim waiting while the probe's caller went away = %v, %v after %s; want Acquired "+
			"(the probe slot was free and the primary answers; state %v)", a.out.Status, a.err, a.d.Round(time.Millisecond), s.State())
	}
}
