package guard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestPipelinedClaimCreatedAsContextEnds: a pipelined claim on a Cluster
// that created the key, answered just as its context ended, is answered as
// the claim it was (or the context's end), not with go-redis's "redis: nil"
// reply of a created key as a Redis error (found by review: a 500 where a
// retry would have been told to come back, with the key held for a lease).
func TestPipelinedClaimCreatedAsContextEnds(t *testing.T) {
	c := testenv.Cluster(t)
	s := guardenv.StoreOn(t, c, guard.RedisOptions{DirectCalls: -1})
	// Time a claim (the fastest of a few), then end contexts around that
	// time: some end between the reply and the store's look at its
	// context.
	rtt := time.Hour
	for i := range 50 {
		t0 := time.Now()
		if _, err := s.Claim(context.Background(), guard.ClaimRequest{Key: guard.Key{Scope: "pipe-nil", ID: fmt.Sprint("warm-", i)}, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		rtt = min(rtt, time.Since(t0))
	}
	counts := map[string]int{}
	for i := range 3000 {
		d := rtt/4 + time.Duration(i%200)*rtt/100
		ctx, cf := context.WithTimeout(context.Background(), d)
		key := guard.Key{Scope: "pipe-nil", ID: fmt.Sprint("pipe-nil-", i)}
		_, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		cf()
		counts[fmt.Sprint(err)]++
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, guard.ErrUnavailable) {
			rec, gerr := s.Get(context.Background(), key)
			t.Fatalf("claim %d, which created the key (record %v, %v), answered %q (%T): neither the context's end nor ErrUnavailable",
				i, rec.State, gerr, err, err)
		}
	}
	t.Logf("rtt %v, answers %v", rtt, counts)
}
