package bench

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// benchScenarios are the rows `go test -bench` measures: the guard's
// fresh and replay paths beside their plain-Redis baselines.
var benchScenarios = Plan([]string{
	Fresh, FreshUnpipelined, ClaimComplete, Replay, ReplayUnpipelined, Storm, StormUnpipelined,
	HTTP, HTTPReplay, Consumer, ConsumerStorm,
})

// benchWorkers is the concurrency of every benchmark, as in the README's table.
const benchWorkers = 64

func BenchmarkMiniredis(b *testing.B) {
	t, err := Open(context.Background(), TargetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer t.Close()
	benchTarget(b, t)
}

// BenchmarkRedis needs IDEMGUARD_REDIS_ADDR. Run with -cpu 2 on the
// 2-core machine: 64 workers are spread with SetParallelism.
func BenchmarkRedis(b *testing.B) {
	t, err := Open(context.Background(), TargetOptions{Addr: testenv.RedisAddr(b), Prefix: testenv.Prefix(b)})
	if err != nil {
		b.Fatal(err)
	}
	defer t.Close()
	benchTarget(b, t)
}

func benchTarget(b *testing.B, t *Target) {
	for _, name := range benchScenarios {
		b.Run(name, func(b *testing.B) {
			sc, _ := lookup(name)
			// Cancellable, as the command's rows run (drive) and as a
			// request's or a consumer's context is.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opts := Options{Concurrency: benchWorkers}.withDefaults()
			e := &env{t: t, opts: opts, prefix: t.rowPrefix()}
			defer func() {
				_ = t.cleanup(ctx, e.prefix)
				if e.close != nil {
					e.close() // the http rows' server and client, as RunAll does
				}
			}()
			fn, err := sc.prepare(ctx, e)
			if err != nil {
				b.Fatal(err)
			}
			if sc.storm {
				e.counts = make([]atomic.Int32, b.N/opts.Duplicates+1)
			}
			if err := t.warm(ctx, benchWorkers); err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			trips0 := t.trips.Load()
			b.SetParallelism(max(1, benchWorkers/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := fn(ctx, next.Add(1)-1); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(t.trips.Load()-trips0)/float64(b.N), "trips/op")
			if sc.storm {
				var dups int64
				for i := range e.counts {
					if c := e.counts[i].Load(); c > 1 {
						dups += int64(c - 1)
					}
				}
				b.ReportMetric(float64(dups), "dup-effects")
			}
		})
	}
}
