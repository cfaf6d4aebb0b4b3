package pgstore_test

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// dstDB opens the test's schema with a session TimeZone (as a server's
// postgresql.conf sets it, initdb choosing the machine's zone) whose
// clocks fall back about 12 hours from now. The zone is a POSIX one, so
// the change needs no calendar date.
func dstDB(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	change := time.Now().UTC().Add(12 * time.Hour)
	day := change.YearDay() - 1 // POSIX "n": zero-based, counting Feb 29
	other := (day + 180) % 365
	// Daylight time (UTC+1) now, ending at change (given in daylight time).
	zone := fmt.Sprintf("XST0XDT,%d/%d,%d/%d", other, 2, day, change.Hour()+1)
	db, err := sql.Open("postgres", testenv.DSNWith(t, dsn, "timezone", zone))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	var got string
	var oneDay float64
	if err := db.QueryRowContext(ctx, `SELECT current_setting('TimeZone'),
		extract(epoch from (now() + interval '1 day') - now()) / 3600`).Scan(&got, &oneDay); err != nil || got != zone {
		t.Fatalf("TimeZone = %q, %v; want %q", got, err, zone)
	}
	t.Logf("TimeZone %s: a day from now is %.0f hours", zone, oneDay)
	return db
}

// TestRetentionUnderDaylightSaving: a pending record is kept for the TTL
// after its lease ends (docs/design.md, "The state machine": "pending
// after lease + TTL"), by the database's clock, however often its lease is
// extended. Extend (and reclaim, a claim sent again) carried the retention
// over as (expires_at - leased_until): a timestamptz difference, which
// PostgreSQL justifies into days ("1 day" for the default TTL of 24h), and
// which, added back, counts calendar days in the session's TimeZone. A
// server whose TimeZone keeps daylight-saving time (initdb writes the
// machine's zone into postgresql.conf) made that day 25 hours in the day
// before a fall back: every extension added an hour to the record's
// retention, and a spring forward took one off (found by review).
func TestRetentionUnderDaylightSaving(t *testing.T) {
	t.Parallel()
	direct, dsn := testenv.Postgres(t)
	if err := pgstore.Migrate(ctx, direct, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	const ttl = 24 * time.Hour
	s, err := pgstore.New(dstDB(t, dsn), pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "s", ID: "dst"}
	out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: 30 * time.Second, TTL: ttl})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	// The holder's keepalive extends its lease as the run goes on: ten
	// extensions, a run of five minutes with the guard's default lease.
	for range 10 {
		if err := s.Extend(ctx, out.Lease, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := s.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	kept := rec.TTL - rec.LeaseLeft // how long the record outlives its lease
	if diff := kept - ttl; diff > time.Second || diff < -time.Second {
		t.Fatalf("after 10 extensions the pending record is kept %v after its lease ends; want the TTL, %v", kept.Round(time.Second), ttl)
	}
}
