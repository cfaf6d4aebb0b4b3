package bench

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// exact returns the q-quantile of sorted by the same rank rule Quantile uses.
func exact(sorted []int64, q float64) int64 {
	rank := int(math.Ceil(q * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

func TestHistogramQuantileAccuracy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dists := map[string]func() int64{
		"uniform_1us_10ms": func() int64 { return 1000 + rng.Int64N(10_000_000) },
		"exponential_mean_200us": func() int64 {
			return int64(rng.ExpFloat64() * 200_000)
		},
		"lognormal_heavy_tail": func() int64 {
			return int64(math.Exp(rng.NormFloat64()*1.5 + 11))
		},
		"small_exact_values": func() int64 { return rng.Int64N(100) },
	}
	for name, gen := range dists {
		t.Run(name, func(t *testing.T) {
			var h Histogram
			samples := make([]int64, 200_000)
			for i := range samples {
				samples[i] = gen()
				h.Record(time.Duration(samples[i]))
			}
			slices.Sort(samples)
			for _, q := range []float64{0, 0.01, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
				want := exact(samples, q)
				got := int64(h.Quantile(q))
				if got < want {
					t.Errorf("q=%v: got %d below the true %d", q, got, want)
				}
				if limit := want + want/subCount; got > limit {
					t.Errorf("q=%v: got %d, true %d: error %.3f%% over 1/%d", q, got, want,
						100*float64(got-want)/float64(want), subCount)
				}
			}
			if h.Min() != time.Duration(samples[0]) || h.Max() != time.Duration(samples[len(samples)-1]) {
				t.Errorf("min/max %v/%v, want %v/%v", h.Min(), h.Max(), samples[0], samples[len(samples)-1])
			}
			if h.Count() != uint64(len(samples)) {
				t.Errorf("count %d, want %d", h.Count(), len(samples))
			}
		})
	}
}

func TestHistogramMerge(t *testing.T) {
	var a, b, all Histogram
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 50_000 {
		d := time.Duration(rng.Int64N(int64(5 * time.Millisecond)))
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var m Histogram
	m.Merge(&a)
	m.Merge(&b)
	m.Merge(nil)
	m.Merge(&Histogram{})
	for _, q := range []float64{0.5, 0.99, 0.999} {
		if m.Quantile(q) != all.Quantile(q) {
			t.Errorf("q=%v: merged %v, single %v", q, m.Quantile(q), all.Quantile(q))
		}
	}
	if m.Count() != all.Count() || m.Min() != all.Min() || m.Max() != all.Max() {
		t.Errorf("merged count/min/max %d/%v/%v, want %d/%v/%v",
			m.Count(), m.Min(), m.Max(), all.Count(), all.Min(), all.Max())
	}
	if diff := math.Abs(float64(m.Mean() - all.Mean())); diff > 1 {
		t.Errorf("mean %v, want %v", m.Mean(), all.Mean())
	}
}

func TestHistogramEdges(t *testing.T) {
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Mean() != 0 {
		t.Fatal("empty histogram must report zero")
	}
	h.Record(-5)
	h.Record(math.MaxInt64)
	if h.Min() != 0 || h.Max() != math.MaxInt64 {
		t.Fatalf("min/max %d/%d", h.Min(), h.Max())
	}
	if got := h.Quantile(1); got != math.MaxInt64 {
		t.Fatalf("q=1: %d", got)
	}
	if got := h.Quantile(0.5); got != 0 {
		t.Fatalf("q=0.5: %d", got)
	}
	// Every bucket's upper bound maps back into that bucket, and the next
	// value into the next one: the buckets tile the int64 range.
	for i := 0; i < buckets-1; i++ {
		hi := bucketHigh(i)
		if bucketOf(hi) != i || bucketOf(hi+1) != i+1 {
			t.Fatalf("bucket %d: high %d maps to %d, next to %d", i, hi, bucketOf(hi), bucketOf(hi+1))
		}
	}
}
