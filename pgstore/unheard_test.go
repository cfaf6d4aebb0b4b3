package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestGuardReleasesClaimWhoseReplyWasLost: a claim whose INSERT
// committed but whose reply was lost (on every copy database/sql sends)
// is released by its token before Do returns ErrUnavailable, so the next
// call runs the effect at once as the first attempt. lib/pq reports such
// a connection as driver.ErrBadConn, which the guard did not count as a
// lost answer: the key stayed in progress for the lease and, under
// MaxAttempts 1, was then exhausted by an attempt that never ran.
func TestGuardReleasesClaimWhoseReplyWasLost(t *testing.T) {
	p, s := proxiedStore(t)
	lease := time.Second
	g := guard.New(s, guard.Options{Lease: lease, MaxAttempts: 1})
	key := guard.Key{Scope: "s", ID: "claim-reply-lost"}
	ran := 0
	fn := func(context.Context, guard.Lease) ([]byte, error) { ran++; return []byte("ok"), nil }

	p.LoseReplies("ON CONFLICT (scope, id) DO NOTHING") // the claim's INSERT, every copy
	_, err := g.Do(ctx, key, "fp", fn)
	p.KeepReplies()
	if p.Cuts() == 0 {
		t.Fatal("no reply lost: the test proves nothing")
	}
	t.Logf("Do with the claim's reply lost (%d cuts) = %v", p.Cuts(), err)
	if !errors.Is(err, guard.ErrUnavailable) || ran != 0 {
		t.Fatalf("Do whose claim reply was lost = %v, ran %d; want ErrUnavailable, not run", err, ran)
	}
	res, err := g.Do(ctx, key, "fp", fn)
	if err != nil || ran != 1 {
		t.Errorf("the next Do = %+v, %v (effect ran %d times); want the effect run at once as the first attempt (the unheard claim released)", res, err, ran)
	}
}

// TestGuardReleasesTakeoverWhoseCommitReplyWasLost: the same for a claim
// that takes a failed key over in a transaction whose COMMIT's reply was
// lost once (database/sql does not send a COMMIT again).
func TestGuardReleasesTakeoverWhoseCommitReplyWasLost(t *testing.T) {
	p, s := proxiedStore(t)
	g := guard.New(s, guard.Options{Lease: 5 * time.Second, MaxAttempts: 3})
	key := guard.Key{Scope: "s", ID: "retake-commit-lost"}
	ran := 0
	boom := errors.New("boom")
	if _, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) { ran++; return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("first Do = %v, want boom", err)
	}
	fn := func(context.Context, guard.Lease) ([]byte, error) { ran++; return []byte("ok"), nil }
	p.LoseReply("COMMIT\x00")
	_, err := g.Do(ctx, key, "fp", fn)
	p.KeepReplies()
	if p.Cuts() != 1 || !errors.Is(err, guard.ErrUnavailable) || ran != 1 {
		t.Fatalf("Do with the COMMIT's reply lost = %v (cuts %d, ran %d); want ErrUnavailable, one cut, not run", err, p.Cuts(), ran)
	}
	t.Logf("Do with the COMMIT's reply lost = %v", err)
	if res, err := g.Do(ctx, key, "fp", fn); err != nil || ran != 2 {
		t.Fatalf("the next Do = %+v, %v (effect ran %d times in all); want the effect run at once (the unheard claim released by its token)", res.Value, err, ran)
	}
}

// proxiedStore is a Store on migrated tables whose connections go
// through a pgproxy, to lose replies.
func proxiedStore(t *testing.T) (*pgproxy.Proxy, *pgstore.Store) {
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	p, db := pgproxy.New(t, dsn)
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return p, s
}
