package guard_test

import (
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestScanRecordsNonUTF8Prefix: Redis key names, and so a store's
// Prefix, are bytes, and ScanRecords finds the records under a prefix that
// is not UTF-8. (Its SCAN MATCH pattern was built from the prefix read as
// runes, a stray byte turned into U+FFFD: the pattern matched none of the
// store's names, and idemguard list showed no record.)
func TestScanRecordsNonUTF8Prefix(t *testing.T) {
	s := guardenv.Store(t, guard.RedisOptions{Prefix: testenv.Prefix(t) + "\xff:"})
	key := guard.Key{Scope: "s", ID: "scanned"}
	out, err := s.Claim(bg, guard.ClaimRequest{Key: key, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Minute})
	if err != nil || out.Status != guard.Acquired {
		t.Fatal(out, err)
	}
	t.Cleanup(func() { _ = testenv.Redis(t).Del(bg, s.Name(key)).Err() })
	if _, err := s.GetByName(bg, s.Name(key)); err != nil {
		t.Fatalf("GetByName(%q) = %v: the record is there", s.Name(key), err)
	}
	var names []string
	if err := s.ScanRecords(bg, func(name string, _ guard.Record, _ error) bool {
		names = append(names, name)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != s.Name(key) {
		t.Fatalf("ScanRecords gave %q, want the one record %q", names, s.Name(key))
	}
}
