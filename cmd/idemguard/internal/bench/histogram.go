package bench

import (
	"math"
	"math/bits"
	"time"
)

// subBits sets the histogram's precision: each power of two is split into
// 2^subBits linear buckets, so a recorded value is known to within
// 1/2^subBits (under 0.8%) of itself.
const (
	subBits  = 7
	subCount = 1 << subBits
	// buckets covers every non-negative int64: values below subCount are
	// exact, then one run of subCount buckets per power of two.
	buckets = subCount + (63-subBits)*subCount
)

// Histogram records durations in log-linear buckets, as HdrHistogram does:
// constant memory and a bounded relative error (under 1/128) whatever the
// number of samples. The zero value is ready to use. It is not safe for
// concurrent use: give each goroutine its own and Merge them.
type Histogram struct {
	counts   []uint64
	n        uint64
	sum      float64
	min, max int64
}

func bucketOf(v int64) int {
	if v < subCount {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - subBits - 1 // v>>shift is in [subCount, 2*subCount)
	return subCount + shift*subCount + int(v>>shift) - subCount
}

// bucketHigh returns the largest value that falls in bucket i.
func bucketHigh(i int) int64 {
	if i < subCount {
		return int64(i)
	}
	shift := (i - subCount) / subCount
	sub := int64((i-subCount)%subCount + subCount)
	if shift >= 63-subBits-1 && sub == 2*subCount-1 {
		return math.MaxInt64
	}
	return (sub+1)<<shift - 1
}

// Record adds one sample. Negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	if h.counts == nil {
		h.counts = make([]uint64, buckets)
	}
	h.counts[bucketOf(v)]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// Merge adds every sample of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.n == 0 {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, buckets)
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count returns the number of samples.
func (h *Histogram) Count() uint64 { return h.n }

// Min returns the smallest sample, exactly.
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Max returns the largest sample, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean returns the mean of the samples, exactly (up to float rounding).
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the value below or at which a fraction q (0..1) of the
// samples lie, as the upper end of its bucket clamped to the largest
// sample: never less than the true quantile, and at most 1/128 above it.
// An empty histogram gives 0.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(math.Ceil(q * float64(h.n)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(max(bucketHigh(i), h.min), h.max))
		}
	}
	return time.Duration(h.max)
}
