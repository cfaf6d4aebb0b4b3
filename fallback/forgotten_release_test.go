package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// flakyPrimary is a primary whose claims and reads answer ErrUnavailable
// while down is set (an outage the breaker sees); holders' writes pass.
type flakyPrimary struct {
	guard.Store
	down atomic.Bool
}

func (f *flakyPrimary) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if f.down.Load() {
		return guard.Outcome{}, fmt.Errorf("%w: test outage", guard.ErrUnavailable)
	}
	return f.Store.Claim(ctx, req)
}

func (f *flakyPrimary) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	if f.down.Load() {
		return guard.Record{}, fmt.Errorf("%w: test outage", guard.ErrUnavailable)
	}
	return f.Store.Get(ctx, key)
}

// A lease taken in the secondary during an outage, whose owner the Store
// forgot: the process restarted (a new fallback.Store over the same
// stores) and its holder resumes with the lease built by hand from Key and
// Token ("accepted too", guard.Lease). The new process called
// ConsultSecondary at start-up, as the package doc asks of a process that
// may have missed an outage. writeTo sends a forgotten lease's write to
// the secondary when the primary answers ErrLeaseLost (Complete, Fail,
// Extend do): but the primary answers a Release of a key it does not hold
// with nil ("Releasing a key that is already gone succeeds"), so the
// Release is answered nil and never reaches the secondary. The secondary
// keeps the key pending for the rest of the lease: every retry is told it
// is in progress, then recovers it as an abandoned claim (Recovered,
// attempt counted; with MaxAttempts 1 the key is Exhausted though its only
// attempt was given back "as if it had never been made").
func TestForgottenSecondaryLeaseReleased(t *testing.T) {
	p := newPrimary(t)
	pg, _ := pgStore(t)
	k := guard.Key{Scope: "forgotten", ID: t.Name()}
	const lease, ttl = time.Minute, time.Hour
	req := func(tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: lease, TTL: ttl}
	}

	// Process 1: Redis is out, the claim is made in the secondary.
	prim := &flakyPrimary{Store: p.store}
	prim.down.Store(true)
	s1 := newStore(t, prim, fallback.Options{Policy: fallback.Secondary, Secondary: pg,
		FailuresToOpen: 1, OpenTimeout: time.Minute, Timeout: 2 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet})
	openBreaker(t, s1)
	out, err := s1.Claim(bg, req("TTTT"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim during the outage: %v %v", out.Status, err)
	}

	// Process 2: a new Store over the same stores, Redis back.
	s2 := newStore(t, p.store, fallback.Options{Policy: fallback.Secondary, Secondary: pg,
		Timeout: 2 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet})
	s2.ConsultSecondary(time.Now().Add(lease + ttl))
	held := guard.Lease{Key: k, Token: "TTTT"} // built by hand: accepted too

	// The holder gives the key back: its effect did not run.
	if err := s2.Release(bg, held); err != nil {
		t.Fatalf("release: %v", err)
	}
	rec, gerr := pg.Get(bg, k)
	next, cerr := s2.Claim(bg, req("UUUU"))
	if gerr == nil {
		t.Errorf("after the holder's Release (answered nil), the secondary still holds the key: %v token %q lease left %s; want it gone (a first attempt released)",
			rec.State, rec.Token, rec.LeaseLeft.Round(time.Second))
	} else if !errors.Is(gerr, guard.ErrNotFound) {
		t.Fatalf("secondary get: %v", gerr)
	}
	if cerr != nil || next.Status != guard.Acquired {
		t.Errorf("the next claim after the Release: %v (lease left %s), %v; want acquired", next.Status, next.LeaseLeft.Round(time.Second), cerr)
	}

	// For contrast: the same forgotten lease's Complete does reach the
	// secondary (the primary answers ErrLeaseLost, writeTo looks there).
	k2 := guard.Key{Scope: "forgotten", ID: t.Name() + "-complete"}
	if o, err := s1.Claim(bg, guard.ClaimRequest{Key: k2, Token: "VVVV", Fingerprint: "fp", Lease: lease, TTL: ttl}); err != nil || o.Status != guard.Acquired {
		t.Fatalf("claim k2: %v %v", o.Status, err)
	}
	cerr2 := s2.Complete(bg, guard.Lease{Key: k2, Token: "VVVV"}, []byte("ok"), ttl)
	r2, _ := pg.Get(bg, k2)
	t.Logf("contrast: Complete of a forgotten lease: %v, secondary record %v", cerr2, r2.State)
}

// lostSecondaryReply is a secondary whose next claim (once lose is
// set) is applied by PostgreSQL and its reply lost (a read timeout on the
// connection).
type lostSecondaryReply struct {
	guard.Store
	lose atomic.Bool
}

func (l *lostSecondaryReply) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	out, err := l.Store.Claim(ctx, req)
	if err == nil && l.lose.CompareAndSwap(true, false) {
		return guard.Outcome{}, fmt.Errorf("%w: %w", guard.ErrUnavailable, &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded})
	}
	return out, err
}

// The same lost Release in one process, no restart: a claim sent to the
// secondary (breaker open; Redis slow or refusing claims, not dead, as
// doc.go says an open breaker may be) is applied and its reply lost.
// guard releases the unheard claim by its token (unheard.go); the Store
// never heard of the lease, so the Release goes to the primary, which
// answers nil for a key it does not hold, and the secondary keeps the key
// pending for the whole lease (every retry in progress, then a recovery
// counted as an attempt: Exhausted with MaxAttempts 1).
func TestUnheardSecondaryClaimReleased(t *testing.T) {
	p := newPrimary(t)
	pg, _ := pgStore(t)
	prim := &flakyPrimary{Store: p.store}
	sec := &lostSecondaryReply{Store: pg}
	s := newStore(t, prim, fallback.Options{Policy: fallback.Secondary, Secondary: sec,
		FailuresToOpen: 1, OpenTimeout: time.Minute, Timeout: 2 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet})
	prim.down.Store(true)
	openBreaker(t, s)
	g := guard.New(s, guard.Options{Lease: 20 * time.Second, TTL: time.Hour, MaxAttempts: 1})
	k := guard.Key{Scope: "forgotten", ID: t.Name()}

	sec.lose.Store(true)
	_, err := g.Do(bg, k, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil })
	if !errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("first attempt: %v, want unavailable (the claim's reply was lost)", err)
	}
	if rec, gerr := pg.Get(bg, k); gerr == nil {
		t.Errorf("the secondary keeps the unheard claim after guard released it: %v token %q lease left %s; want it gone",
			rec.State, rec.Token, rec.LeaseLeft.Round(time.Second))
	}
	ran := false
	_, err = g.Do(bg, k, "fp", func(context.Context, guard.Lease) ([]byte, error) { ran = true; return []byte("ok"), nil })
	if err != nil || !ran {
		t.Errorf("the retry: ran %v, %v; want it run (nothing holds the key)", ran, err)
	}
}
