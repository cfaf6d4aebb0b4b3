package memstore_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestMemoryFollowsLiveRecords: "memory follows the live records as long
// as the store is used" (the package documentation). After a burst of
// short-lived keys has expired and been swept, while the store is still
// in use, the heap is back near where it was before the burst (it held
// about a fifth of the burst for good: a Go map never gives back the
// storage of deleted entries, nor the expiry heap its capacity).
func TestMemoryFollowsLiveRecords(t *testing.T) {
	const burst = 50_000
	s, clk := newStore(t, memstore.Options{})
	live := guard.Key{Scope: "s", ID: "live"}
	mustClaim(t, s, req(live, "L"), guard.Acquired)
	before := heapInUse()
	for i := range burst {
		key := guard.Key{Scope: "burst", ID: fmt.Sprint(i)}
		r := req(key, "A")
		r.Lease, r.TTL = time.Second, time.Second
		mustClaim(t, s, r, guard.Acquired)
		if err := s.Complete(ctx, lease(key, "A"), []byte("ok"), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	peak := heapInUse()
	clk.Advance(time.Minute)
	for s.Stats().Records > 1 { // the store is used: each call sweeps
		if _, err := s.Get(ctx, live); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	after := heapInUse()
	t.Logf("heap: before %d KiB, peak %d KiB, after all %d expired records were swept %d KiB (stats %+v)",
		before>>10, peak>>10, burst, after>>10, st)
	if after > before+(peak-before)/10 {
		t.Fatalf("after the burst expired and was swept the store still holds %d KiB (%.0f%% of the burst's %d KiB): memory did not follow the live records",
			(after-before)>>10, 100*float64(after-before)/float64(peak-before), (peak-before)>>10)
	}
	runtime.KeepAlive(s)
}
