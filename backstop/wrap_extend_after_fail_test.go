package backstop_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// extendThenWait is a primary whose Extend, once the primary took it,
// calls between before it returns (Wrap then extends the holder's mark):
// a test places other calls between the two halves of Wrap's Extend.
type extendThenWait struct {
	guard.Store
	between func()
}

func (s *extendThenWait) Extend(ctx context.Context, lease guard.Lease, d time.Duration) error {
	err := s.Store.Extend(ctx, lease, d)
	s.between()
	return err
}

// TestWrapExtensionAfterFailKeepsMarkEnded: holder A's extension reaches
// Redis, and its mark's extension reaches PostgreSQL only after A's Fail
// (or Release) ended A's lease on its mark (the extension was given up,
// its statement still queued behind a lock, or its goroutine
// unscheduled). A ran nothing after it, so that late extension must not
// give its mark a lease again: the key's next claim takes it, rather than
// being told it is in progress for a lease nobody holds.
func TestWrapExtensionAfterFailKeepsMarkEnded(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	b := mustBackstop(t, db, pgstore.Options{})
	for _, c := range []struct {
		end         string
		nextAttempt int // a released first attempt leaves the key as if never claimed
	}{{"fail", 2}, {"release", 1}} {
		t.Run(c.end, func(t *testing.T) {
			extended, proceed := make(chan struct{}), make(chan struct{})
			primary := &extendThenWait{Store: guardenv.Store(t, guard.RedisOptions{}), between: func() {
				close(extended)
				<-proceed
			}}
			s := backstop.Wrap(primary, b)
			key := newKey(t)
			claim := func(token string) (guard.Outcome, error) {
				return s.Claim(ctx, guard.ClaimRequest{Key: key, Token: token, Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Minute})
			}
			out, err := claim("A")
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("A's claim = %s, %v", out.Status, err)
			}
			extErr := make(chan error, 1)
			go func() { extErr <- s.Extend(ctx, out.Lease, 10*time.Second) }()
			<-extended
			if c.end == "fail" {
				err = s.Fail(ctx, out.Lease, "boom", time.Minute)
			} else {
				err = s.Release(ctx, out.Lease)
			}
			if err != nil {
				t.Fatalf("A's %s = %v", c.end, err)
			}
			close(proceed)
			t.Logf("A's late extension answered %v", <-extErr)
			if out, err := claim("B"); err != nil || out.Status != guard.Acquired || out.Lease.Attempt != c.nextAttempt {
				t.Fatalf("B's claim after A's %s = %+v, %v; want acquired, attempt %d", c.end, out, err, c.nextAttempt)
			}
		})
	}
}
