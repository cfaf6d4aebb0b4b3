package bench_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/idemguard/idemguard/cmd/idemguard/internal/bench"
)

// Measure the guard under a duplicate storm right after its baseline, the
// naive GET-then-SETEX pattern, on an embedded miniredis.
func ExampleTarget_RunAll() {
	t, err := bench.Open(context.Background(), bench.TargetOptions{}) // no Addr: embedded miniredis
	if err != nil {
		panic(err)
	}
	defer t.Close()
	results, err := t.RunAll(context.Background(), []string{bench.Storm}, []int{8},
		bench.Options{Keys: 20, Duplicates: 4, Work: time.Millisecond}, nil)
	if err != nil {
		panic(err)
	}
	for _, r := range results {
		fmt.Printf("%s: %d keys, effects == keys: %t\n", r.Scenario, r.Keys, r.Effects == r.Keys)
	}
	// Output:
	// naive-storm-auto: 20 keys, effects == keys: false
	// storm: 20 keys, effects == keys: true
}

func ExampleHistogram() {
	var h bench.Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	fmt.Println(h.Count(), h.Quantile(0.5), h.Quantile(0.99), h.Max())
	// Output:
	// 1000 501.759µs 991.231µs 1ms
}

// Each guard row runs right after its baseline in the same transport mode.
func ExamplePlan() {
	fmt.Println(bench.Plan([]string{bench.Fresh, bench.ReplayUnpipelined, bench.HTTPReplay}))
	// Output:
	// [setnx+set-auto fresh get replay-unpipelined http-plain http-replay]
}

// Size Redis for the records the guard keeps: bytes of memory per
// completed record, on a Redis of its own (miniredis has no memory figure).
func ExampleTarget_Memory() {
	t, err := bench.Open(context.Background(), bench.TargetOptions{Addr: "127.0.0.1:6379"})
	if err != nil {
		panic(err)
	}
	defer t.Close()
	m, err := t.Memory(context.Background(), bench.MemoryOptions{Records: 20000, ResultSize: 200})
	if err != nil {
		panic(err)
	}
	if err := bench.WriteMemory(os.Stdout, m); err != nil {
		panic(err)
	}
}
