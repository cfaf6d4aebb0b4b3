package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// flakyGets is a primary whose Get answers ErrUnavailable while down is
// set (so the test can open the breaker while Redis serves claims).
type flakyGets struct {
	guard.Store
	down atomic.Bool
}

func (f *flakyGets) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	if f.down.Load() {
		return guard.Record{}, fmt.Errorf("%w: test outage", guard.ErrUnavailable)
	}
	return f.Store.Get(ctx, key)
}

// hookedGets is a secondary that runs before() ahead of its Get of key.
type hookedGets struct {
	guard.Store
	key    guard.Key
	before func()
}

func (h *hookedGets) Get(ctx context.Context, key guard.Key) (guard.Record, error) {
	if key == h.key && h.before != nil {
		h.before()
	}
	return h.Store.Get(ctx, key)
}

// A claim Redis grants finds the key failed in the secondary, so (rule 2)
// the primary's claim is released and the claim is made in the secondary.
// The breaker opens while the secondary is being read (another call
// fails). The release must still be sent, as a holder's write is: refused
// by the open breaker untried, it left the key pending in Redis for the
// whole lease, and once the secondary's holder completed the key and the
// breaker closed, every retry was told the key was in progress for the
// rest of the minute-long lease instead of being replayed.
func TestSwitchBackReleaseNotRefusedByOpenBreaker(t *testing.T) {
	p := newPrimary(t)
	pg, _ := pgStore(t)
	k := guard.Key{Scope: "undo", ID: t.Name()}
	prim := &flakyGets{Store: p.store}
	sec := &hookedGets{Store: pg, key: k}
	s := newStore(t, prim, fallback.Options{
		Policy: fallback.Secondary, Secondary: sec,
		FailuresToOpen: 1, OpenTimeout: 200 * time.Millisecond, Timeout: 3 * time.Second, SecondaryTimeout: 5 * time.Second, Logger: quiet,
	})
	req := func(tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	// The key failed in the secondary during an earlier outage.
	out, err := pg.Claim(bg, req("OLD"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("seed claim: %v %v", out.Status, err)
	}
	if err := pg.Fail(bg, out.Lease, "boom", time.Hour); err != nil {
		t.Fatal(err)
	}

	// While the switch-back check reads the secondary, another call finds
	// the primary out and opens the breaker.
	var once atomic.Bool
	sec.before = func() {
		if once.Swap(true) {
			return
		}
		prim.down.Store(true)
		_, _ = s.Get(bg, guard.Key{Scope: "undo", ID: "other"})
		prim.down.Store(false)
		if s.State() != fallback.StateOpen {
			t.Errorf("breaker %v, want open", s.State())
		}
	}
	out, err = s.Claim(bg, req("NEW"))
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim: %v %v", out.Status, err)
	}
	// The claim is the secondary's; its holder completes there.
	if err := s.Complete(bg, out.Lease, []byte("done"), time.Hour); err != nil {
		t.Fatal(err)
	}
	closeBreaker(t, s, 10*time.Second)
	if rec, err := p.get(t, k); err == nil {
		t.Logf("left in redis: state %v token %s lease left %s", rec.State, rec.Token, rec.LeaseLeft)
	} else if !errors.Is(err, guard.ErrNotFound) {
		t.Fatal(err)
	}
	out, err = s.Claim(bg, req("RETRY"))
	if err != nil || out.Status != guard.Replay {
		t.Fatalf("retry of the key completed in the secondary = %v (lease left %s), %v; want replay", out.Status, out.LeaseLeft, err)
	}
}
