package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/idemguard/idemguard/bench"
)

// defaultScenarios pairs each guard row with its baseline, baseline first.
var defaultScenarios = []string{
	bench.SetNXSet, bench.Fresh, bench.ClaimComplete, bench.FreshUnpipelined,
	bench.SetNXSetPipe, bench.SetNXSetAuto,
	bench.Get, bench.Replay, bench.ReplayUnpipelined, bench.GetAuto,
	bench.NaiveStorm, bench.Storm,
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("bench")
	scenarios := fs.String("scenario", strings.Join(defaultScenarios, ","), "comma-separated scenarios: "+strings.Join(bench.Scenarios(), ", ")+", or all")
	concurrency := fs.String("concurrency", "64", "comma-separated worker counts, one set of rows each")
	duration := fs.Duration("duration", 2*time.Second, "how long each row runs")
	ops := fs.Int64("ops", 0, "run this many operations per row instead of --duration")
	target := fs.String("target", "miniredis", `"miniredis" (embedded) or the host:port of a Redis`)
	pool := fs.Int("pool", 0, "connection pool size (default: the largest concurrency, at least 64)")
	keys := fs.Int("keys", 1000, "storm: distinct keys; replay/get: completed keys cycled over")
	dups := fs.Int("duplicates", 8, "storm: concurrent copies of each key")
	work := fs.Duration("work", 0, "storm: how long each business effect takes")
	size := fs.Int("result-size", 64, "bytes of each stored result")
	chart := fs.String("chart", "", "also draw throughput and p99 by concurrency into this .svg or .png file")
	format := fs.String("format", "markdown", "table format: markdown or text")
	rounds := fs.Int("rounds", 1, "run the whole matrix this many times, interleaved, and report each row's median-throughput round")
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
	fmt.Fprintf(stderr, "idemguard bench: %s, pool %d, GOMAXPROCS %d, %d rows\n", t.Name(), *pool, gomaxprocs(), len(list)*len(conc))
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
