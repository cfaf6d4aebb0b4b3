package occ

import (
	"math"
	"testing"
	"time"
)

// TestRetryWaitsCapped: no wait between tries exceeds MaxInterval, as its
// comment promises, jitter included; waits at the cap are still spread
// (by Jitter, below it), and the first is InitialInterval spread by
// Jitter. backoff's ExponentialBackOff caps the interval before spreading
// it, so with the default Jitter a wait could be 1.5 times MaxInterval.
func TestRetryWaitsCapped(t *testing.T) {
	t.Parallel()
	for _, o := range []RetryOptions{
		{},
		{InitialInterval: 40 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		{InitialInterval: time.Second, MaxInterval: time.Second, Jitter: 1},
		{MaxInterval: 20 * time.Millisecond, Jitter: -1},
	} {
		o = o.withDefaults()
		b := o.backOff()
		first := b.NextBackOff()
		if lo, hi := time.Duration(float64(o.InitialInterval)*(1-o.Jitter)), min(o.MaxInterval, time.Duration(float64(o.InitialInterval)*(1+o.Jitter))+1); first < lo || first > hi {
			t.Errorf("%+v: first wait %v, want within [%v, %v]", o, first, lo, hi)
		}
		seen := map[time.Duration]bool{}
		for i := range 2000 {
			d := b.NextBackOff()
			if d > o.MaxInterval || d < 0 {
				t.Fatalf("%+v: wait %d is %v, above MaxInterval", o, i+2, d)
			}
			if i >= 100 {
				seen[d] = true
			}
		}
		if o.Jitter > 0 && len(seen) < 100 {
			t.Errorf("%+v: waits at the cap took %d values: not spread", o, len(seen))
		}
	}
}

// TestRetryInitialAboveCap: an InitialInterval above MaxInterval starts at
// the cap, spread below it like every wait there. The first wait, drawn
// around InitialInterval and reflected below the cap, came out 0 (an
// immediate retry) whenever it was drawn above twice the cap.
func TestRetryInitialAboveCap(t *testing.T) {
	t.Parallel()
	o := RetryOptions{InitialInterval: 5 * time.Second, MaxInterval: time.Second}.withDefaults()
	for range 200 {
		b := o.backOff()
		if d, lo := b.NextBackOff(), time.Duration(float64(o.MaxInterval)*(1-o.Jitter)); d < lo || d > o.MaxInterval {
			t.Fatalf("first wait %v, want within [%v, %v]", d, lo, o.MaxInterval)
		}
	}
}

// TestRetryMalformedOptions: a Multiplier or Jitter that is NaN, or a
// Jitter above 1, still gives waits within [0, MaxInterval]: none below 0
// (a wait of -2^63ns, an immediate retry: a hot loop against the
// database).
func TestRetryMalformedOptions(t *testing.T) {
	t.Parallel()
	for _, o := range []RetryOptions{
		{Multiplier: math.NaN()},
		{Jitter: math.NaN()},
		{Jitter: 3},
		{Multiplier: math.Inf(1)},
		{Jitter: math.Inf(1)},
	} {
		in := o
		o = o.withDefaults()
		b := o.backOff()
		for i := range 200 {
			if d := b.NextBackOff(); d < 0 || d > o.MaxInterval {
				t.Errorf("%+v: wait %d is %v, want within [0, %v]", in, i+1, d, o.MaxInterval)
				break
			}
		}
	}
}
