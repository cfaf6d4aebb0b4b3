package pgstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestClaimCommitReplyLost: a claim that takes a failed key over commits
// in a transaction; when the COMMIT's reply is lost, the claim's outcome
// is unknown to the caller and must be reported as guard.ErrUnavailable,
// never as acquired-or-not. The same claim sent again then gets the
// answer the committed transaction left (acquired, the same fence), and
// any other claimant finds the key in progress.
func TestClaimCommitReplyLost(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	p, db := pgproxy.New(t, dsn)
	s, err := pgstore.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "s", ID: "commit-lost"}
	r := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	a, err := s.Claim(ctx, r)
	if err != nil || a.Status != guard.Acquired {
		t.Fatalf("claim A = %+v, %v", a, err)
	}
	if err := s.Fail(ctx, a.Lease, "boom", time.Hour); err != nil {
		t.Fatal(err)
	}

	r.Token = "B"
	p.LoseReply("COMMIT\x00") // the statement, not BEGIN ISOLATION LEVEL READ COMMITTED
	out, err := s.Claim(ctx, r)
	p.KeepReplies()
	if p.Cuts() != 1 {
		t.Fatalf("replies lost: %d, want the COMMIT's (claim answered %+v, %v): the test proves nothing", p.Cuts(), out, err)
	}
	if !errors.Is(err, guard.ErrUnavailable) || out.Status != 0 {
		t.Fatalf("claim whose COMMIT reply was lost = %+v, %v; want no answer and ErrUnavailable", out, err)
	}
	again, err := s.Claim(ctx, r)
	if err != nil || again.Status != guard.Acquired || again.Lease.Fence != 2 || again.Lease.Attempt != 2 {
		t.Fatalf("the same claim again = %+v, %v; want acquired with fence 2, attempt 2", again, err)
	}
	r.Token = "C"
	if out, err := s.Claim(ctx, r); err != nil || out.Status != guard.InProgress {
		t.Fatalf("another claim = %+v, %v; want in progress", out, err)
	}
}
