package storetest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/guard/storetest"
	"github.com/idemguard/idemguard/memstore"
)

// slowReplies is a correct store whose every fourth Acquired answer
// reaches its caller delay after the store took the claim, as a reply a
// loaded machine or a slow network holds back past the lease.
type slowReplies struct {
	guard.Store
	delay    time.Duration
	acquired atomic.Int64
}

func (s *slowReplies) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	out, err := s.Store.Claim(ctx, req)
	if err == nil && out.Status == guard.Acquired && s.acquired.Add(1)%4 == 0 {
		time.Sleep(s.delay) // the reply's late delivery, not synchronisation
	}
	return out, err
}

// TestLeasesNeverOverlapLateReplies: a claim answered after its lease ran
// out (and another claimant took the key over meanwhile, rightly) owned
// nothing; LeasesNeverOverlap must not count it as a holder from its
// answer, or a correct store fails it.
func TestLeasesNeverOverlapLateReplies(t *testing.T) {
	const lease = 50 * time.Millisecond
	s := &slowReplies{Store: memstore.New(memstore.Options{}), delay: 3 * lease}
	storetest.LeasesNeverOverlap(t, s, lease, 8, time.Second)
	if s.acquired.Load() < 4 {
		t.Fatalf("%d claims acquired: no reply was held back", s.acquired.Load())
	}
}
