package bench_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idemguard/idemguard/bench"
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
