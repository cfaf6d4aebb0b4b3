package pgstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/pgsql/pgproxy"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestStepsSaveStepReplyLost: a SaveStep whose UPDATE PostgreSQL
// applied but whose reply was lost (database/sql sends it again on
// another connection when lib/pq calls the connection bad) stores the
// step once, at its index, and answers the holder OK or ErrUnavailable,
// never a refusal of its own step; the holder's next step goes after it.
func TestStepsSaveStepReplyLost(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	p, db := pgproxy.New(t, dsn)
	s := pgenv.Store(t, db, pgstore.Options{})
	key := guard.Key{Scope: "steps", ID: "reply-lost"}
	out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	l := out.Lease
	for i, st := range []guard.StepResult{{Name: "reserve", Result: []byte("r")}, {Name: "charge", Result: []byte("ch")}} {
		p.LoseReply("UPDATE")
		err := s.SaveStep(ctx, l, i, st)
		p.KeepReplies()
		if p.Cuts() != int64(i+1) {
			t.Fatalf("step %d: %d replies lost; the test proves nothing", i, p.Cuts())
		}
		if err != nil && !errors.Is(err, guard.ErrUnavailable) {
			t.Fatalf("step %d whose reply was lost = %v; want nil or ErrUnavailable", i, err)
		}
		// The holder learns from its claim sent again, or sends the step again.
		if err := s.SaveStep(ctx, l, i, st); err != nil {
			t.Fatalf("step %d sent again = %v", i, err)
		}
	}
	rec, err := s.Get(ctx, key)
	if err != nil || len(rec.Steps) != 2 || rec.Steps[0].Name != "reserve" || rec.Steps[1].Name != "charge" {
		t.Fatalf("record %+v, %v; want reserve, charge once each", rec, err)
	}
	var count int
	if err := direct.QueryRowContext(ctx, `SELECT step_count FROM idemguard_keys WHERE scope = $1 AND id = $2`, key.Scope, key.ID).Scan(&count); err != nil || count != 2 {
		t.Fatalf("step_count %d, %v; want 2", count, err)
	}
}
