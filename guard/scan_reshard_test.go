package guard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestScanRecordsThroughResharding: "A record kept for the whole scan is
// given" (ScanRecords) on a Cluster whose slot moves, mid-scan, from a
// master not yet scanned to one already scanned (each master was scanned
// once: the slot's 2,000 records were never given; the masters are
// scanned again while slots moved); one whose slots move in every pass
// ends with ErrScanUnsettled.
func TestScanRecordsThroughResharding(t *testing.T) {
	rc := startOwnCluster(t, 3, 0)
	c := rc.client(nil)
	// The prefix carries the hash tag: every record is in one slot.
	s := guardenv.StoreOn(t, c, guard.RedisOptions{Prefix: "scan{slot}:"})
	ctx := context.Background()
	const n = 2000
	claimScanKeys(t, s, n)
	slot := int(guard.KeySlot(s.Name(guard.Key{Scope: "scan", ID: "0"})))
	src := rc.owner(slot)
	var dst *testenv.Server
	var others []*testenv.Server
	for _, m := range rc.masters {
		if m != src {
			others = append(others, m)
			dst = m
		}
	}
	if k, _ := rc.cl(src).DBSize(ctx).Result(); k != n {
		t.Fatalf("%d keys on the slot's master, want %d", k, n)
	}
	scans := func(m *testenv.Server) string {
		info, _ := rc.cl(m).Info(ctx, "commandstats").Result()
		for line := range strings.Lines(info) {
			if strings.HasPrefix(line, "cmdstat_scan:") {
				return line
			}
		}
		return ""
	}

	given := map[string]bool{}
	moved := false
	err := s.ScanRecords(ctx, func(name string, rec guard.Record, err error) bool {
		given[name] = true
		if !moved {
			moved = true
			// The other masters hold no record: their scans are over once
			// they have answered their one SCAN.
			testenv.WaitFor(t, 10*time.Second, "the empty masters scanned", func() bool {
				for _, m := range others {
					if scans(m) == "" {
						return false
					}
				}
				return true
			})
			// Resharding: the slot moves to a master already scanned.
			rc.beginMove(slot, src, dst)
			for rc.moveKeys(slot, src, dst, 100) > 0 {
			}
			rc.endMove(slot, src, dst)
		}
		return true
	})
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	if k, _ := rc.cl(dst).DBSize(ctx).Result(); k != n {
		t.Fatalf("%d keys on the new master, want %d", k, n)
	}
	// Every record existed before the scan and after it.
	if len(given) != n {
		t.Errorf("ScanRecords gave %d of the %d records kept for the whole scan (a slot moved between masters during it)", len(given), n)
	}

	// A slot that moves during every pass: the scan says it may have
	// missed records.
	from, to := dst, src
	passes := 0
	guard.OnScanPass(t, func(int) {
		passes++
		rc.beginMove(slot, from, to)
		for rc.moveKeys(slot, from, to, 500) > 0 {
		}
		rc.endMove(slot, from, to)
		from, to = to, from
	})
	err = s.ScanRecords(ctx, func(string, guard.Record, error) bool { return true })
	if !errors.Is(err, guard.ErrScanUnsettled) || passes != 3 {
		t.Errorf("scan with the slot moving in each of its %d passes: %v, want ErrScanUnsettled after 3", passes, err)
	}
}

// claimScanKeys claims keys "scan"/0 to n-1 in s, pending for an hour, in
// batches of 200.
func claimScanKeys(t *testing.T, s *guard.RedisStore, n int) {
	t.Helper()
	for start := 0; start < n; start += 200 {
		reqs := make([]guard.ClaimRequest, min(200, n-start))
		for i := range reqs {
			reqs[i] = guard.ClaimRequest{Key: guard.Key{Scope: "scan", ID: fmt.Sprint(start + i)},
				Token: fmt.Sprint("tok", start+i), Fingerprint: "fp", Lease: time.Hour, TTL: time.Hour}
		}
		_, errs := s.ClaimBatch(context.Background(), reqs)
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
}
