package fallback_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// heldClaims is a secondary whose Claim for one token waits, once it
// is called, until the test lets it go (a slow PostgreSQL round trip).
type heldClaims struct {
	guard.Store
	token   string
	entered chan struct{}
	goOn    chan struct{}
	once    sync.Once
}

func (h *heldClaims) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	if req.Token == h.token {
		h.once.Do(func() { close(h.entered) })
		<-h.goOn
	}
	return h.Store.Claim(ctx, req)
}

// TestSwitchBackClaimsSecondaryBeforeUndo: rule 2's pending case. A claim
// Redis grants finds the key pending in the secondary (a holder of the
// outage), so it is made in the secondary and the primary's claim given
// back. It was given back first: in between, the key was held nowhere the
// next claim's check could see once the outage holder gave it back
// (Release of a first attempt removes its record; a failed record's TTL
// running out does the same), and a second claim of this very Store,
// granted by Redis, found no record in the secondary and kept the
// primary's lease while the first acquired in the secondary: two holders
// of one key, one in each store, the breaker closed all along.
func TestSwitchBackClaimsSecondaryBeforeUndo(t *testing.T) {
	p := newPrimary(t)
	pg, _ := pgStore(t)
	k := guard.Key{Scope: "switchback", ID: t.Name()}
	sec := &heldClaims{Store: pg, token: "AAAA", entered: make(chan struct{}), goOn: make(chan struct{})}
	s := newStore(t, p.store, fallback.Options{
		Policy: fallback.Secondary, Secondary: sec,
		FailuresToOpen: 1, OpenTimeout: time.Minute, Timeout: 3 * time.Second, SecondaryTimeout: 10 * time.Second, Logger: quiet,
	})
	req := func(tok string) guard.ClaimRequest {
		return guard.ClaimRequest{Key: k, Token: tok, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	}
	// A holder of the outage (another replica's, or this one's before a
	// restart) holds the key in the secondary.
	h, err := pg.Claim(bg, req("HHHH"))
	if err != nil || h.Status != guard.Acquired {
		t.Fatalf("outage holder's claim: %v %v", h.Status, err)
	}

	type answer struct {
		out guard.Outcome
		err error
	}
	first := make(chan answer, 1)
	go func() {
		out, err := s.Claim(bg, req("AAAA"))
		first <- answer{out, err}
	}()
	// The first claim was granted by Redis, found the holder, released
	// Redis's claim and is on its way to the secondary.
	select {
	case <-sec.entered:
	case a := <-first:
		close(sec.goOn)
		t.Fatalf("first claim answered without claiming in the secondary: %v %v", a.out.Status, a.err)
	}
	// The outage holder gives the key back (its effect did not run).
	if err := pg.Release(bg, h.Lease); err != nil {
		close(sec.goOn)
		t.Fatal(err)
	}
	second, err := s.Claim(bg, req("BBBB"))
	close(sec.goOn)
	a := <-first
	if a.err != nil {
		t.Fatalf("first claim: %v", a.err)
	}
	if err != nil {
		t.Fatalf("second claim: %v", err)
	}
	t.Logf("first claim %v (fence %d), second claim %v (fence %d)", a.out.Status, a.out.Lease.Fence, second.Status, second.Lease.Fence)
	if a.out.Status == guard.Acquired && second.Status == guard.Acquired {
		rp, _ := p.get(t, k)
		rs, _ := pg.Get(bg, k)
		t.Fatalf("two claims of one key both acquired through one Store (want at most one): "+
			"primary record %v token %q, secondary record %v token %q", rp.State, rp.Token, rs.State, rs.Token)
	}
}
