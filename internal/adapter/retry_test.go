package adapter

import (
	"math"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestBackoffFullJitter(t *testing.T) {
	for n, ceiling := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 60: time.Second} {
		var top time.Duration
		for range 2000 {
			d := Backoff(100*time.Millisecond, time.Second, n)
			if d < 0 || d >= ceiling {
				t.Fatalf("retry %d: delay %v outside [0, %v)", n, d, ceiling)
			}
			top = max(top, d)
		}
		if top < ceiling*3/4 {
			t.Fatalf("retry %d: largest of 2000 delays %v, want near %v", n, top, ceiling)
		}
	}
}

func TestInFlightWait(t *testing.T) {
	const ceiling, floor = time.Second, 20 * time.Millisecond
	cases := []struct {
		name string
		told time.Duration
		ok   bool
		d    time.Duration // the delay before jitter
	}{
		{"told less than the ceiling", 300 * time.Millisecond, true, 300 * time.Millisecond},
		{"told more: the ceiling", 5 * time.Second, true, ceiling},
		{"not told: the ceiling", 0, false, ceiling},
		{"told 0: the floor", 0, true, floor},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := tc.d, time.Duration(0)
			for range 2000 {
				w := InFlightWait(tc.told, tc.ok, ceiling, floor)
				if w < tc.d-tc.d/5 || w > tc.d {
					t.Fatalf("wait %v outside [%v, %v]", w, tc.d-tc.d/5, tc.d)
				}
				lo, hi = min(lo, w), max(hi, w)
			}
			if hi-lo < tc.d/10 { // the duplicates of a key spread out
				t.Fatalf("waits %v..%v: no jitter", lo, hi)
			}
		})
	}
}

func TestNewUUIDv7(t *testing.T) {
	seen := map[string]bool{}
	prev := ""
	for range 100 {
		k, err := NewUUIDv7()
		if err != nil {
			t.Fatal(err)
		}
		u, err := uuid.Parse(k)
		if err != nil || u.Version() != 7 || len(k) != 36 {
			t.Fatalf("%q: %v, version %d", k, err, u.Version())
		}
		if seen[k] || k < prev[:min(len(prev), 13)] {
			t.Fatalf("%q after %q", k, prev)
		}
		seen[k] = true
		prev = k
	}
}

// TestBackoffLongCeiling: a MaxDelay longer than the doubling can reach
// without overflowing (no cap, in effect) and many retries keep the delay
// in [0, MaxDelay): the ceiling stops doubling where it would pass it, and
// never wraps round to zero or below (which rand.N panics on).
func TestBackoffLongCeiling(t *testing.T) {
	for _, maxDelay := range []time.Duration{math.MaxInt64, math.MaxInt64 / 3, 1<<62 + 1} {
		for _, base := range []time.Duration{time.Nanosecond, 3 * time.Nanosecond, 100 * time.Millisecond, math.MaxInt64 / 2} {
			for _, n := range []int{1, 37, 38, 63, 64, 65, 200, 1000} {
				d := Backoff(base, maxDelay, n)
				if d < 0 || d >= maxDelay {
					t.Fatalf("Backoff(%v, %v, %d) = %v", base, maxDelay, n, d)
				}
			}
		}
	}
}
