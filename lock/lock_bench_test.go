package lock_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/lock"
)

func benchDo(b *testing.B, opts lock.Options) {
	nodes := lock.NewNodes(testenvRedlock(b)...)
	for _, c := range nodes {
		b.Cleanup(func() { _ = c.Close() })
	}
	l, err := lock.New(nodes, opts)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	b.Cleanup(func() { // fence counters never expire: drop the benchmark's
		for _, c := range nodes {
			for i := range n.Load() {
				_ = c.Del(context.Background(), opts.Prefix+"bench-"+strconv.FormatInt(i+1, 10)+":fence").Err()
			}
		}
	})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		// One name per goroutine: the cost of a lock, not of waiting.
		name := "bench-" + strconv.FormatInt(n.Add(1), 10)
		for pb.Next() {
			if err := l.Do(context.Background(), name, func(context.Context) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkDo: acquire + release of uncontended locks on the 3 Redlock
// nodes (2 rounds to 3 nodes per Do), GOMAXPROCS goroutines.
func BenchmarkDo(b *testing.B) {
	benchDo(b, lock.Options{Prefix: benchPrefix(b)})
}

// BenchmarkDoFencing: the same with Fencing (2 more rounds per Do).
func BenchmarkDoFencing(b *testing.B) {
	benchDo(b, lock.Options{Prefix: benchPrefix(b), Fencing: true})
}
