package fallback_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/backstop"
	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestSwitchBackOverBackstopSharedTables: a primary wrapped by
// backstop.Wrap, with pgstore's Store as the secondary on the same tables
// (they share the keys table by design), writes its holder's mark into the
// row the switch-back check reads. That row is the claim being checked,
// not a record of the secondary's: the primary's lease must stand. It was
// taken for a secondary claim, so every claim while the checks were on
// went to the secondary, and each one moved the end of the checks another
// TTL on: the Store never switched back to Redis while keys kept coming.
func TestSwitchBackOverBackstopSharedTables(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := fallback.New(backstop.Wrap(rs, b), fallback.Options{Policy: fallback.Secondary, Secondary: pgenv.Store(t, db, pgstore.Options{}), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	// As after an outage: the next hour's claims are checked.
	s.ConsultSecondary(time.Now().Add(time.Hour))
	before := s.ConsultUntil()
	key := guard.Key{Scope: "s", ID: t.Name()}
	out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: 10 * time.Second, TTL: 24 * time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %s, %v", out.Status, err)
	}
	rec, err := rs.Get(bg, key)
	switch {
	case errors.Is(err, guard.ErrNotFound):
		t.Fatalf("a key no secondary claim ever touched was claimed in the secondary, not in Redis")
	case err != nil:
		t.Fatal(err)
	case rec.State != guard.StatePending || rec.Token != "A":
		t.Fatalf("Redis record %s by %q; want pending by A", rec.State, rec.Token)
	}
	if after := s.ConsultUntil(); after.After(before) {
		t.Fatalf("the switch-back checks were moved on from %s to %s by a claim of the primary's", before, after)
	}
	// The holder's writes go to the primary; its mark is the row.
	if err := s.Complete(bg, out.Lease, []byte("done"), 24*time.Hour); err != nil {
		t.Fatalf("complete: %v", err)
	}
	if rec, err := rs.Get(bg, key); err != nil || rec.State != guard.StateCompleted {
		t.Fatalf("Redis record after Complete: %+v, %v", rec.State, err)
	}
}

// TestSwitchBackKeepsSecondaryHolder: a holder S took the key in the
// secondary (pgstore, on the tables the primary's backstop marks in)
// during an outage and is still running when the primary is back. A claim
// of the same key through the primary is told the key is in progress: the
// backstop's mark must not take the row from S, and the Redis claim it
// made is released.
func TestSwitchBackKeepsSecondaryHolder(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	rs := guardenv.Store(t, guard.RedisOptions{})
	b, err := backstop.New(db, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sec := pgenv.Store(t, db, pgstore.Options{})
	s, err := fallback.New(backstop.Wrap(rs, b), fallback.Options{Policy: fallback.Secondary, Secondary: sec, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "s", ID: t.Name()}
	req := guard.ClaimRequest{Key: key, Token: "S", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	held, err := sec.Claim(bg, req)
	if err != nil || held.Status != guard.Acquired {
		t.Fatalf("secondary claim = %s, %v", held.Status, err)
	}
	s.ConsultSecondary(time.Now().Add(time.Hour))
	req.Token = "T"
	out, err := s.Claim(bg, req)
	if err != nil || out.Status != guard.InProgress || out.LeaseLeft <= 0 {
		t.Fatalf("claim while S holds the key in the secondary = %s (fence %d, %s left), %v; want InProgress",
			out.Status, out.Lease.Fence, out.LeaseLeft, err)
	}
	if _, err := rs.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("the refused claim's Redis record: %v; want it released", err)
	}
	// S still owns its row: it completes.
	if err := sec.Complete(bg, held.Lease, []byte("from S"), time.Hour); err != nil {
		t.Fatalf("S's complete: %v", err)
	}
	if out, err := s.Claim(bg, req); err != nil || out.Status != guard.Replay || string(out.Result) != "from S" {
		t.Fatalf("claim after S completed = %s %q, %v; want S's replay", out.Status, out.Result, err)
	}
}
