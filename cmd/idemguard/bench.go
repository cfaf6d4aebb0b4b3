package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idemguard/cmd/idemguard/internal/bench"
)

// defaultScenarios are the guard's rows; each runs right after its
// baseline in the same transport mode (bench.Plan).
var defaultScenarios = []string{
	bench.Fresh, bench.FreshUnpipelined, bench.ClaimComplete, bench.StoreFresh,
	bench.Replay, bench.ReplayUnpipelined, bench.StoreReplay,
	bench.Storm, bench.StormUnpipelined,
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench")
	scenarios := fs.String("scenario", strings.Join(defaultScenarios, ","), "comma-separated scenarios: "+strings.Join(bench.Scenarios(), ", ")+", or all; each guard row runs right after its baseline; or memory alone: Redis bytes per completed record")
	records := fs.Int("records", 20000, "memory: completed records to write")
	concurrency := fs.String("concurrency", "64", "comma-separated worker counts, one set of rows each")
	duration := fs.Duration("duration", 2*time.Second, "how long each row runs")
	ops := fs.Int64("ops", 0, "run this many operations per row instead of --duration")
	target := fs.String("target", "miniredis", `"miniredis" (embedded) or the host:port of a Redis`)
	pool := fs.Int("pool", 0, "connection pool size (default: the largest concurrency, at least 64)")
	keys := fs.Int("keys", 1000, "storm: distinct keys; replay/get: completed keys cycled over")
	dups := fs.Int("duplicates", 8, "storm: concurrent copies of each key")
	work := fs.Duration("work", 0, "storm: how long each business effect takes")
	size := fs.Int("result-size", 64, "bytes of each stored result; 200 with --scenario memory unless given")
	chart := fs.String("chart", "", "also draw throughput and p99 by concurrency into this .svg or .png file")
	format := fs.String("format", "markdown", "table format: markdown or text")
	rounds := fs.Int("rounds", 1, "run the whole matrix this many times, interleaved, and report each row's median-throughput round")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the client side (the guard, the HTTP server and client, the baselines) to this file, for go tool pprof")
	if err := parse(fs, args, stderr); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	list := splitList(*scenarios)
	if len(list) == 1 && list[0] == "all" {
		list = bench.Scenarios()
	}
	if len(list) == 0 {
		return usagef("--scenario is empty")
	}
	if slices.Contains(list, bench.Memory) {
		if len(list) > 1 {
			return usagef("--scenario memory runs alone")
		}
		sizeSet := false
		var other []string // flags the memory scenario does not read
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "result-size":
				sizeSet = true
			case "scenario", "records", "target", "pool":
			default:
				other = append(other, "--"+f.Name)
			}
		})
		if len(other) > 0 {
			return usagef("%s: not read by --scenario memory (it takes --records, --target, --pool and --result-size)", strings.Join(other, ", "))
		}
		if !sizeSet {
			*size = 200
		}
		return runMemory(ctx, *target, *records, *size, *pool, stdout, stderr)
	}
	for _, s := range list {
		if bench.About(s) == "" {
			return usagef("--scenario: unknown scenario %q (have %s)", s, strings.Join(bench.Scenarios(), ", "))
		}
	}
	var conc []int
	for _, c := range splitList(*concurrency) {
		n, err := strconv.Atoi(c)
		if err != nil || n <= 0 {
			return usagef("--concurrency: %q is not a positive number", c)
		}
		conc = append(conc, n)
	}
	if len(conc) == 0 {
		return usagef("--concurrency is empty")
	}
	switch {
	case *duration <= 0:
		return usagef("--duration %s must be positive", *duration)
	case *ops < 0:
		return usagef("--ops %d must not be negative", *ops)
	case *pool < 0:
		return usagef("--pool %d must not be negative", *pool)
	case *keys <= 0:
		return usagef("--keys %d must be positive", *keys)
	case *dups <= 0:
		return usagef("--duplicates %d must be positive", *dups)
	case *work < 0:
		return usagef("--work %s must not be negative", *work)
	case *rounds <= 0:
		return usagef("--rounds %d must be positive", *rounds)
	case *size <= 0:
		return usagef("--result-size %d must be positive", *size)
	case *format != "markdown" && *format != "text":
		return usagef("--format %q: want markdown or text", *format)
	case *chart != "" && !strings.HasSuffix(*chart, ".svg") && !strings.HasSuffix(*chart, ".png"):
		return usagef("--chart %q: the file name must end in .svg or .png", *chart)
	}
	if *pool == 0 {
		*pool = max(64, maxOf(conc))
	}
	addr := *target
	if addr == "miniredis" || addr == "" {
		addr = ""
	} else if !strings.Contains(addr, ":") {
		return usagef("--target %q: want miniredis or host:port", *target)
	}

	t, err := bench.Open(ctx, bench.TargetOptions{Addr: addr, PoolSize: *pool})
	if err != nil {
		return err
	}
	defer t.Close()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rows := bench.Plan(list)
	fmt.Fprintf(stderr, "idemguard bench: %s, pool %d, GOMAXPROCS %d, %d rows (%s), load average %s\n",
		t.Name(), *pool, gomaxprocs(), len(rows)*len(conc), strings.Join(rows, ", "), bench.LoadAverage())
	loadBefore := bench.LoadAverage()
	opts := bench.Options{Duration: *duration, Ops: *ops, Keys: *keys, Duplicates: *dups, Work: *work, ResultSize: *size}
	var all [][]bench.Result
	for round := range *rounds {
		if *rounds > 1 {
			fmt.Fprintf(stderr, "round %d of %d\n", round+1, *rounds)
		}
		results, err := t.RunAll(ctx, list, conc, opts, func(r bench.Result) {
			fmt.Fprintf(stderr, "  %-16s %4d workers  %9.0f ops/s  p99 %s\n", r.Scenario, r.Concurrency, r.OpsPerSec(), r.Latency.Quantile(0.99).Round(time.Microsecond))
		})
		if err != nil {
			return err
		}
		all = append(all, results)
	}
	results := bench.Median(all)
	fmt.Fprintf(stdout, "%s, workers %s, %d round(s) (median); load average (1, 5, 15 min) %s before, %s after.\n"+
		"× baseline: the median over the rounds of each guard row's throughput over its baseline's, run right before it in the same transport mode (in brackets, with several rounds: the lowest and the highest round's).\n\n",
		t.Name(), *concurrency, *rounds, loadBefore, bench.LoadAverage())
	if *format == "text" {
		err = bench.WriteText(stdout, results)
	} else {
		err = bench.WriteTable(stdout, results)
	}
	if err != nil {
		return err
	}
	if *chart != "" {
		if err := bench.WriteChart(*chart, results); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "idemguard bench: chart written to %s\n", *chart)
	}
	return nil
}

// runMemory runs the memory scenario on the Redis at target.
func runMemory(ctx context.Context, target string, records, size, pool int, stdout, stderr io.Writer) error {
	switch {
	case records <= 0:
		return usagef("--records %d must be positive", records)
	case size <= 0:
		return usagef("--result-size %d must be positive", size)
	case target == "" || target == "miniredis":
		return usagef("--scenario memory needs --target host:port: miniredis has no memory figure")
	case !strings.Contains(target, ":"):
		return usagef("--target %q: want host:port", target)
	}
	t, err := bench.Open(ctx, bench.TargetOptions{Addr: target, PoolSize: max(pool, 64)})
	if err != nil {
		return err
	}
	defer t.Close()
	fmt.Fprintf(stderr, "idemguard bench: memory on %s: %d records, %d-byte results, load average %s\n", t.Name(), records, size, bench.LoadAverage())
	m, err := t.Memory(ctx, bench.MemoryOptions{Records: records, ResultSize: size})
	if err != nil {
		return err
	}
	return bench.WriteMemory(stdout, m)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func maxOf(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func gomaxprocs() int { return runtime.GOMAXPROCS(0) }
