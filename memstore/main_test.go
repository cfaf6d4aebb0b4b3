package memstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// TestMain fails the package if any goroutine outlives the tests: the
// store starts none, and the guards the tests run must leave none behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var ctx = context.Background()

// clock is a manual clock for Options.Now, safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newStore returns a store on a manual clock whose bookkeeping is checked
// when the test ends.
func newStore(t testing.TB, opts memstore.Options) (*memstore.Store, *clock) {
	t.Helper()
	c := newClock()
	opts.Now = c.Now
	s := memstore.New(opts)
	t.Cleanup(func() { checkInvariants(t, s) })
	return s, c
}

func checkInvariants(t testing.TB, s *memstore.Store) {
	t.Helper()
	if err := memstore.CheckInvariants(s); err != nil {
		t.Errorf("store bookkeeping: %v", err)
	}
}

func req(key guard.Key, token string) guard.ClaimRequest {
	return guard.ClaimRequest{Key: key, Token: token, Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Hour}
}

func mustClaim(t testing.TB, s guard.Store, r guard.ClaimRequest, want guard.Status) guard.Outcome {
	t.Helper()
	out, err := s.Claim(ctx, r)
	if err != nil {
		t.Fatalf("Claim(%s, %s): %v", r.Key, r.Token, err)
	}
	if out.Status != want {
		t.Fatalf("Claim(%s, %s) = %+v, want %v", r.Key, r.Token, out, want)
	}
	return out
}

func lease(key guard.Key, token string) guard.Lease { return guard.Lease{Key: key, Token: token} }
