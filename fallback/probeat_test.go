package fallback_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
)

// ProbeAt says when the open breaker lets its first probe through:
// OpenTimeout after it opened. Closed or half-open, it says nothing; a
// failed probe opens the breaker again, and ProbeAt then counts from that.
func TestProbeAt(t *testing.T) {
	const open = time.Hour // never half-opens on its own here
	p := newPrimary(t)
	s := newStore(t, p.store, fallback.Options{FailuresToOpen: 1, OpenTimeout: open, Timeout: time.Second, Logger: quiet})
	if at, ok := s.ProbeAt(); ok || !at.IsZero() {
		t.Fatalf("closed breaker: ProbeAt = %v, %v; want the zero Time, false", at, ok)
	}
	p.srv.Kill()
	before := time.Now()
	openBreaker(t, s)
	after := time.Now()
	at, ok := s.ProbeAt()
	if !ok || at.Before(before.Add(open)) || at.After(after.Add(open)) {
		t.Fatalf("open breaker: ProbeAt = %v, %v; want between %v and %v (OpenTimeout after it opened)",
			at, ok, before.Add(open), after.Add(open))
	}

	// A short OpenTimeout: half-open, then opened again by a failed probe.
	const short = 200 * time.Millisecond
	s = newStore(t, p.store, fallback.Options{FailuresToOpen: 1, OpenTimeout: short, Timeout: time.Second, Logger: quiet})
	openBreaker(t, s)
	first, ok := s.ProbeAt()
	if !ok && s.State() == fallback.StateOpen {
		t.Fatalf("open breaker: ProbeAt says not open")
	}
	waitFor(t, 5*time.Second, "half-open", func() bool { return s.State() == fallback.StateHalfOpen })
	if at, ok := s.ProbeAt(); ok || !at.IsZero() {
		t.Fatalf("half-open breaker: ProbeAt = %v, %v; want the zero Time, false", at, ok)
	}
	probed := time.Now()
	if _, err := s.Claim(bg, claimReq("k", "T")); !isUnavailable(err) {
		t.Fatalf("probe on a dead primary = %v, want ErrUnavailable", err)
	}
	at, ok = s.ProbeAt()
	if s.State() == fallback.StateHalfOpen {
		return // a loaded machine let OpenTimeout pass again: nothing more to judge
	}
	if !ok || at.Before(probed.Add(short)) || !at.After(first) {
		t.Fatalf("reopened breaker: ProbeAt = %v, %v; want at least %v (OpenTimeout after the failed probe), after %v",
			at, ok, probed.Add(short), first)
	}
}
