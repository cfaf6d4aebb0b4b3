package guard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestPlainCompleteBatchRefusedUnderOOM: scripts sent plain (without the
// allow-oom flag line: RedisOptions.PlainScripts, a server that refuses
// flag lines) have their SET refused on a server out of memory. A batch
// of completions (scripts/complete_batch.lua) then reports each key not
// completed, and WriteBatch answers ErrUnavailable for it, never OK: a
// holder told its result was stored while the record stayed pending would
// see its effect run again once the lease ran out.
func TestPlainCompleteBatchRefusedUnderOOM(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	admin := srv.Client()
	s := guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{PlainScripts: true})
	var ws []guard.Write
	for _, id := range []string{"a", "b"} {
		out, err := s.Claim(bg, guard.ClaimRequest{Key: guard.Key{Scope: "oom", ID: id}, Token: "A", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || out.Status != guard.Acquired {
			t.Fatal(out, err)
		}
		ws = append(ws, guard.Write{Kind: guard.WriteComplete, Lease: out.Lease, Result: []byte("r"), TTL: time.Hour})
	}
	fillMemory(t, admin)
	for i, err := range s.WriteBatch(bg, ws) {
		if !errors.Is(err, guard.ErrUnavailable) {
			t.Errorf("completion %d on a full server, scripts plain = %v, want ErrUnavailable", i, err)
		}
		if rec, err := s.Get(bg, ws[i].Lease.Key); err != nil || rec.State != guard.StatePending {
			t.Errorf("record %d after the refused completion = %+v, %v; want still pending", i, rec, err)
		}
	}
	if err := admin.ConfigSet(bg, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	for i, err := range s.WriteBatch(bg, ws) {
		if err != nil {
			t.Errorf("completion %d once memory is free = %v", i, err)
		}
	}
}
