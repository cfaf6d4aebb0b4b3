package backstop_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/memstore"
	"github.com/idemguard/idemguard/pgstore"
)

// The last allowed attempt's holder pauses past its lease; the next claim
// finds the lease run out at MaxAttempts and answers Exhausted, which is
// final (a consumer dead-letters the message). When the paused holder
// wakes, its Commit must be refused: it was accepted (its own token and
// fence still stood on the row), so the effect happened after the key
// was given up, on the Postgres Store and under Wrap alike. Under Wrap
// A's claim's answer takes 50ms to come back from the primary, so that
// the holder's mark, written then with the database's clock, outlasts the
// primary's lease by as much (as it does by a few milliseconds, or by a
// clock skew, in production): the mark is failed all the same. So is a
// step A commits instead (CommitStep, Backstop.Step's write), which was
// accepted after Commit was refused (found by review).
func TestCommitRefusedAfterExhausted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ via, write string }{{"pgstore", "commit"}, {"wrap", "commit"}, {"pgstore", "step"}, {"wrap", "step"}} {
		via := c.via
		t.Run(c.via+"/"+c.write, func(t *testing.T) {
			t.Parallel()
			db := pgenv.Migrated(t, pgstore.Options{})
			pgenv.PaymentsTable(t, db)
			b := mustBackstop(t, db, pgstore.Options{})
			var s guard.Store = pgenv.Store(t, db, pgstore.Options{})
			if via == "wrap" {
				s = backstop.Wrap(slowAnswer{memstore.New(memstore.Options{}), 50 * time.Millisecond}, b)
			}
			key := newKey(t)
			req := func(tok string) guard.ClaimRequest {
				return guard.ClaimRequest{Key: key, Token: tok, Fingerprint: "fp", Lease: 100 * time.Millisecond, TTL: time.Hour, MaxAttempts: 1}
			}
			a, err := s.Claim(ctx, req("A"))
			if err != nil || a.Status != guard.Acquired {
				t.Fatalf("claim A = %+v, %v", a, err)
			}
			testenv.WaitFor(t, 10*time.Second, "A's lease to run out", func() bool {
				rec, err := s.Get(ctx, key)
				return err == nil && rec.LeaseLeft == 0
			})
			if out, err := s.Claim(ctx, req("B")); err != nil || out.Status != guard.Exhausted {
				t.Fatalf("claim B = %+v, %v; want Exhausted", out, err)
			}
			// A wakes and commits: a payment, and the key's row or a step's.
			if c.write == "commit" {
				err = pay(t, db, b, a.Lease, "paid by A")
			} else {
				err = payWith(t, db, a.Lease, func(tx *sql.Tx) error { return b.CommitStep(ctx, tx, a.Lease, "charge", []byte("paid by A")) })
			}
			if rows, _ := pgenv.CountPayments(t, db); err == nil || rows != 0 {
				t.Fatalf("A's %s after the key was answered Exhausted = %v with %d payments; want it refused, none", c.write, err, rows)
			}
			if !errors.Is(err, backstop.ErrStaleFence) {
				t.Errorf("A's %s = %v, want ErrStaleFence", c.write, err)
			}
		})
	}
}

// slowAnswer is a store whose answers to claims with token A take d to
// come back.
type slowAnswer struct {
	guard.Store
	d time.Duration
}

func (s slowAnswer) Claim(ctx context.Context, req guard.ClaimRequest) (guard.Outcome, error) {
	out, err := s.Store.Claim(ctx, req)
	if req.Token == "A" {
		<-time.After(s.d)
	}
	return out, err
}
