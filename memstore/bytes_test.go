package memstore_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/memstore"
)

// TestBytesEstimate: what Stats.Bytes counts for 20,000 completed records
// is within 25% of the heap they take (runtime.MemStats after a GC), for
// small records and for records of a usual shape (a 30-byte scope, a UUID,
// a SHA-256 hex fingerprint, a 26-character token, a 200-byte result).
// It is what Options.MaxBytes bounds, so it must not be far off.
func TestBytesEstimate(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 20,000 records")
	}
	if strconv.IntSize != 64 {
		t.Skip("RecordOverhead is measured for 64-bit platforms")
	}
	for _, shape := range []struct {
		name, scope, fp string
		id              func(int) string
		result          []byte
	}{
		{"small", "s", "f", func(i int) string { return fmt.Sprintf("%x", i) }, nil},
		{"usual", "tenant-0042/POST /v1/charges/x", strings.Repeat("ab", 32),
			func(i int) string { return fmt.Sprintf("%08x-1b2c-4d3e-8f40-%012x", i, i) }, bytes.Repeat([]byte("r"), 200)},
	} {
		t.Run(shape.name, func(t *testing.T) {
			const n = 20000
			keys := make([]guard.Key, n)
			tokens := make([]string, n)
			for i := range keys {
				keys[i] = guard.Key{Scope: shape.scope, ID: shape.id(i)}
				tokens[i] = rand.Text()
			}
			s := memstore.New(memstore.Options{})
			before := heapAlloc()
			for i, key := range keys {
				r := guard.ClaimRequest{Key: key, Token: tokens[i], Fingerprint: shape.fp, Lease: time.Minute, TTL: time.Hour}
				if _, err := s.Claim(ctx, r); err != nil {
					t.Fatal(err)
				}
				if err := s.Complete(ctx, guard.Lease{Key: key, Token: tokens[i]}, shape.result, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			heap := heapAlloc() - before
			counted := s.Stats().Bytes
			runtime.KeepAlive(s)
			per, perCounted := float64(heap)/n, float64(counted)/n
			t.Logf("heap %.0f B per record, counted %.0f B (RecordOverhead %d)", per, perCounted, memstore.RecordOverhead)
			if perCounted < 0.75*per || perCounted > 1.25*per {
				t.Fatalf("counted %.0f B per record, heap %.0f B: RecordOverhead is off", perCounted, per)
			}
		})
	}
}

func heapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
