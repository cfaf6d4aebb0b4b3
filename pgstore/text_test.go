package pgstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv/pgenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestStoredText: text a PostgreSQL text value holds is kept as it is (the
// backstop's rows and the rows written before binary values were encoded
// compare equal), and no two strings are kept alike, the encoded form of
// one included.
func TestStoredText(t *testing.T) {
	in := []string{"", "fp", "ключ", "\x00", "\xff", "\xfe", "a\x00b", "\x01", "\x01AA==", "\x01" + "AA==", "AA==", "\x01x"}
	seen := map[string]string{}
	for _, s := range in {
		v := pgstore.StoredText(s)
		if strings.ContainsRune(v, 0) || !utf8.ValidString(v) {
			t.Errorf("StoredText(%q) = %q: not a PostgreSQL text value", s, v)
		}
		if prev, ok := seen[v]; ok && prev != s {
			t.Errorf("StoredText(%q) = StoredText(%q) = %q", s, prev, v)
		}
		seen[v] = s
	}
	for _, s := range []string{"", "fp", "ключ", "sha256/128:00ff"} {
		if v := pgstore.StoredText(s); v != s {
			t.Errorf("StoredText(%q) = %q, want it unchanged", s, v)
		}
	}
}

// TestUnreadableTextIsCorrupt: a fingerprint or reason column that starts
// like an encoded value but does not decode is ErrCorrupt naming the key,
// from Get and from a claim that answers with the reason; never a panic or
// a wrong answer.
func TestUnreadableTextIsCorrupt(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "unreadable"}
	r := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "\xff", Lease: time.Minute, TTL: time.Hour, MaxAttempts: 1}
	out, err := s.Claim(ctx, r)
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	if err := s.Fail(ctx, out.Lease, "bad \x00 byte", time.Hour); err != nil {
		t.Fatal(err)
	}
	r.Token = "B"
	if out, err := s.Claim(ctx, r); err != nil || out.Status != guard.Exhausted || out.LastError != "bad \x00 byte" {
		t.Fatalf("claim after the only attempt failed = %+v, %v; want exhausted with the reason", out, err)
	}
	corrupt := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, guard.ErrCorrupt) || !strings.Contains(err.Error(), key.String()) {
			t.Errorf("%s = %v, want ErrCorrupt naming %s", what, err, key)
		}
	}
	pgenv.Exec(t, db, `UPDATE idemguard_keys SET last_error = E'\x01%%%' WHERE scope = $1 AND id = $2`, key.Scope, key.ID)
	_, err = s.Get(ctx, key)
	corrupt("Get with an unreadable reason", err)
	_, err = s.Claim(ctx, r)
	corrupt("exhausted claim with an unreadable reason", err)
	pgenv.Exec(t, db, `UPDATE idemguard_keys SET last_error = '', fingerprint = E'\x01%%%' WHERE scope = $1 AND id = $2`, key.Scope, key.ID)
	_, err = s.Get(ctx, key)
	corrupt("Get with an unreadable fingerprint", err)
}

// TestStepCountDisagreeingIsCorrupt: a keys row whose steps column does
// not hold step_count steps (a row written by hand, a restore of one
// column) cannot be read whole. SaveStep answered ErrUnavailable ("the
// record kept changing") after four round trips, which a caller retries
// for ever; now ErrCorrupt naming the key, as Claim and Get answer for a
// steps column cut short.
func TestStepCountDisagreeingIsCorrupt(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "step-count"}
	out, err := s.Claim(ctx, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	if err := s.SaveStep(ctx, out.Lease, 0, guard.StepResult{Name: "charge", Result: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	// One step in the column, step_count says two.
	pgenv.Exec(t, db, `UPDATE idemguard_keys SET step_count = 2 WHERE scope = $1 AND id = $2`, key.Scope, key.ID)
	err = s.SaveStep(ctx, out.Lease, 1, guard.StepResult{Name: "refund", Result: []byte("r")})
	if !errors.Is(err, guard.ErrCorrupt) || !strings.Contains(err.Error(), key.String()) {
		t.Errorf("SaveStep on a row whose step_count disagrees with its steps = %v (unavailable: %t), want ErrCorrupt naming %s",
			err, errors.Is(err, guard.ErrUnavailable), key)
	}
}

// TestUnreadableFingerprintClaimIsCorrupt: a row whose fingerprint column
// starts like an encoded value but does not decode is a record the store
// cannot read: Get says ErrCorrupt (TestUnreadableTextIsCorrupt). A claim
// of its key answered Mismatch, which httpx turns into 422 "this key was
// used with a different request" for the very request that made it; now
// ErrCorrupt too.
func TestUnreadableFingerprintClaimIsCorrupt(t *testing.T) {
	t.Parallel()
	db := pgenv.Migrated(t, pgstore.Options{})
	s := pgenv.Store(t, db, pgstore.Options{})
	key := guard.Key{Scope: "s", ID: "fp-unreadable"}
	r := guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	if out, err := s.Claim(ctx, r); err != nil || out.Status != guard.Acquired {
		t.Fatalf("claim = %+v, %v", out, err)
	}
	if err := s.Complete(ctx, guard.Lease{Key: key, Token: "A"}, []byte("result"), time.Hour); err != nil {
		t.Fatal(err)
	}
	pgenv.Exec(t, db, `UPDATE idemguard_keys SET fingerprint = E'\x01%%%' WHERE scope = $1 AND id = $2`, key.Scope, key.ID)
	if _, err := s.Get(ctx, key); !errors.Is(err, guard.ErrCorrupt) {
		t.Fatalf("precondition: Get = %v, want ErrCorrupt", err)
	}
	r.Token = "B"
	out, err := s.Claim(ctx, r)
	if !errors.Is(err, guard.ErrCorrupt) {
		t.Errorf("claim of a row with an unreadable fingerprint = %+v, %v; want ErrCorrupt naming %s", out, err, key)
	}
}
