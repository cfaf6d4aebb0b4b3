package backstop_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestWrapMarkReplyLost: a claim whose mark committed in PostgreSQL but
// whose reply never came back fails (the backstop's answer is unknown) and
// releases its claim in Redis. The key must then be as if never claimed,
// as after any released first attempt: a request with another payload
// takes it, rather than being refused as a mismatch by the orphaned mark
// for the mark's whole retention. The batch path undoes its claims the
// same way.
func TestWrapMarkReplyLost(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	p, db := pgproxy.New(t, dsn)
	b := mustBackstop(t, db, pgstore.Options{})
	s := backstop.Wrap(guardenv.Store(t, guard.RedisOptions{}), b)
	bs, ok := s.(guard.BatchStore)
	if !ok {
		t.Fatalf("%T is not a guard.BatchStore", s)
	}
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "claim", true: "batch"}[batch], func(t *testing.T) {
			key := newKey(t)
			claim := func(tok, fp string) (guard.Outcome, error) {
				req := guard.ClaimRequest{Key: key, Token: tok, Fingerprint: fp, Lease: 10 * time.Second, TTL: time.Hour, MaxAttempts: 3}
				if !batch {
					return s.Claim(ctx, req)
				}
				out, errs := bs.ClaimBatch(ctx, []guard.ClaimRequest{req})
				return out[0], errs[0]
			}
			before := p.Cuts()
			p.LoseReplies("RETURNING fence")
			out, err := claim("A", "fp-a")
			p.KeepReplies()
			if !errors.Is(err, guard.ErrUnavailable) {
				t.Fatalf("claim whose mark's reply was lost = %s, %v; want ErrUnavailable", out.Status, err)
			}
			var n int
			if err := direct.QueryRowContext(ctx, `SELECT count(*) FROM idemguard_keys WHERE id = $1 AND token = 'A'`, key.ID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if p.Cuts() == before || n != 1 {
				t.Fatalf("replies lost %d, marks of A %d: the mark did not commit, the test proves nothing", p.Cuts()-before, n)
			}
			out, err = claim("B", "fp-b")
			if err != nil || out.Status != guard.Acquired || out.Lease.Attempt != 1 {
				t.Fatalf("claim with another payload after the failed claim = %s (attempt %d), %v; want a first attempt acquired", out.Status, out.Lease.Attempt, err)
			}
		})
	}
}
