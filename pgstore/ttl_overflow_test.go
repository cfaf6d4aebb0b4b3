package pgstore_test

import (
	"math"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// A record kept for centuries (a lease and a retention of 200 years, the
// lease then extended by the longest Duration, which keeps the gap
// between the lease's end and the row's) reads back with its lease left
// and retention saturated at the longest Duration, never overflowed into
// negative ones (which the CLI and fallback read as "unknown"). (Get's
// microseconds were multiplied into a Duration unchecked.)
func TestGetTTLSaturates(t *testing.T) {
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	const century = 100 * 365 * 24 * time.Hour
	key := guard.Key{Scope: "ttl", ID: "centuries"}
	out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "T", Fingerprint: "fp", Lease: 2 * century, TTL: 2 * century})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim: %+v, %v", out, err)
	}
	if err := s.Extend(ctx, out.Lease, math.MaxInt64); err != nil {
		t.Fatalf("extend: %v", err)
	}
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.TTL <= 0 || rec.LeaseLeft <= 0 || rec.TTL < rec.LeaseLeft {
		t.Fatalf("Get: TTL %v, LeaseLeft %v; want both positive, TTL at least LeaseLeft (saturated, not overflowed)", rec.TTL, rec.LeaseLeft)
	}
}
