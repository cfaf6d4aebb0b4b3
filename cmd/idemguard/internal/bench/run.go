package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Options shape one row of a run. The zero value is ready to use.
type Options struct {
	// Concurrency is the number of workers issuing operations at once.
	// Default 64.
	Concurrency int
	// Duration is how long a row runs when Ops is zero. Default 2s.
	Duration time.Duration
	// Ops, when set, runs exactly this many operations instead of running
	// for Duration. The storm scenarios always run Keys × Duplicates.
	Ops int64
	// Keys is the number of distinct keys of a storm, and of the completed
	// keys a replay or GET row cycles over. Default 1000.
	Keys int
	// Duplicates is how many copies of each key a storm sends, all at
	// once. Default 8.
	Duplicates int
	// ResultSize is the size in bytes of each stored result. Default 64.
	ResultSize int
	// Work is how long each business effect takes in the storm, HTTP and
	// consumer scenarios (a sleep standing in for a payment call). Default 0.
	Work time.Duration
	// TTL is the retention of every key written. Default 2 minutes, or
	// a minute more than Duration when that is longer: a benchmark leaves
	// nothing behind for long even if its clean-up is cut. A row's keys
	// must outlive it: a TTL not longer than Duration is refused.
	TTL time.Duration
}

func (o Options) withDefaults() Options {
	if o.Concurrency <= 0 {
		o.Concurrency = 64
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Second
	}
	if o.Keys <= 0 {
		o.Keys = 1000
	}
	if o.Duplicates <= 0 {
		o.Duplicates = 8
	}
	if o.ResultSize <= 0 {
		o.ResultSize = 64
	}
	if o.TTL <= 0 {
		o.TTL = max(2*time.Minute, o.Duration+time.Minute)
	}
	return o
}

// Validate reports options that cannot run.
func (o Options) Validate() error {
	switch {
	case o.Concurrency < 0:
		return fmt.Errorf("concurrency %d is negative", o.Concurrency)
	case o.Duration < 0:
		return fmt.Errorf("duration %s is negative", o.Duration)
	case o.Ops < 0:
		return fmt.Errorf("ops %d is negative", o.Ops)
	case o.Keys < 0, o.Duplicates < 0, o.ResultSize < 0:
		return errors.New("keys, duplicates and result size must not be negative")
	case o.Work < 0:
		return fmt.Errorf("work %s is negative", o.Work)
	case o.TTL > 0 && o.Ops == 0 && o.withDefaults().Duration >= o.TTL:
		// The keys a row prepares (the stored results of a replay, a
		// consumer's stream) would expire while it runs.
		return fmt.Errorf("ttl %s is not longer than the duration %s of a row", o.TTL, o.withDefaults().Duration)
	}
	return nil
}

// Result is one measured row.
type Result struct {
	Scenario    string
	Target      string
	Concurrency int
	Ops         int64         // operations completed
	Elapsed     time.Duration // wall time of the measured part
	Latency     Histogram     // per-operation latency
	// RoundTripsPerOp counts client round trips (a pipeline is one).
	RoundTripsPerOp float64
	// CommandsPerOp is from INFO commandstats: commands a script runs count
	// too. NaN when the server does not tell (miniredis). On a shared
	// server other clients' commands are included.
	CommandsPerOp float64
	// AllocsPerOp is heap allocations per operation in this process
	// (runtime.MemStats.Mallocs); an embedded miniredis's count too.
	AllocsPerOp float64
	// ClientCPUPerOp is this process's CPU time (user + system, from
	// getrusage) per operation: what the client side costs, however busy
	// the machine is.
	ClientCPUPerOp time.Duration
	// ServerCPUPerOp is the Redis server's CPU time (INFO cpu) per
	// operation; -1 when the server does not tell. On a shared server
	// other clients' work is included.
	ServerCPUPerOp time.Duration
	// Storm, HTTP and consumer rows: distinct keys sent, business effects
	// run, and effects beyond one per key. Zero for the other rows.
	Keys             int64
	Effects          int64
	DuplicateEffects int64
	Replays          int64 // answers served from a stored result
	Conflicts        int64 // answers "in progress elsewhere"

	// Partner is, for a baseline run right before a guard row to pair
	// with it, that row's scenario; "" otherwise.
	Partner string
	// Ratio is, for a guard row, its throughput over that of its
	// baseline run right before it; after Median, the median of the
	// rounds' ratios. 0 when the row has no baseline.
	Ratio float64
	// RatioLow and RatioHigh are, after Median of two rounds or more,
	// the lowest and highest of the rounds' ratios: how far one round
	// can stray from the median on this machine. 0 otherwise.
	RatioLow, RatioHigh float64
}

// OpsPerSec is the row's throughput.
func (r Result) OpsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// Run measures one scenario on t.
func (t *Target) Run(ctx context.Context, scenario string, opts Options) (Result, error) {
	if err := opts.Validate(); err != nil {
		return Result{}, fmt.Errorf("bench: %w", err)
	}
	opts = opts.withDefaults()
	sc, ok := lookup(scenario)
	if !ok {
		return Result{}, fmt.Errorf("bench: unknown scenario %q (have %s)", scenario, names())
	}
	e := &env{t: t, opts: opts, prefix: t.rowPrefix()}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = t.cleanup(cctx, e.prefix)
		if e.close != nil {
			e.close()
		}
	}()
	op, err := sc.prepare(ctx, e)
	if err != nil {
		return Result{}, fmt.Errorf("bench: %s: prepare: %w", scenario, err)
	}
	total := opts.Ops
	if sc.storm {
		total = int64(opts.Keys) * int64(opts.Duplicates)
		e.counts = make([]atomic.Int32, opts.Keys)
	}
	if err := t.warm(ctx, opts.Concurrency); err != nil {
		return Result{}, fmt.Errorf("bench: %s: %w", scenario, err)
	}

	res := Result{Scenario: scenario, Target: t.name, Concurrency: opts.Concurrency}
	cmds0, cmdsOK := t.commands(ctx)
	srv0, srvOK := t.serverCPU(ctx)
	cpu0 := processCPU()
	trips0 := t.trips.Load()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs0 := ms.Mallocs

	ops, elapsed, hist, err := drive(ctx, opts.Concurrency, total, opts.Duration, op)

	runtime.ReadMemStats(&ms)
	mallocs1 := ms.Mallocs
	trips1 := t.trips.Load()
	cpu1 := processCPU()
	srv1, srvOK1 := t.serverCPU(ctx)
	cmds1, cmdsOK1 := t.commands(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("bench: %s: %w", scenario, err)
	}
	res.Ops, res.Elapsed, res.Latency = ops, elapsed, hist
	n := float64(max(ops, 1))
	res.RoundTripsPerOp = float64(trips1-trips0) / n
	res.AllocsPerOp = float64(mallocs1-mallocs0) / n
	res.ClientCPUPerOp = time.Duration(float64(cpu1-cpu0) / n)
	res.ServerCPUPerOp = -1
	if srvOK && srvOK1 {
		res.ServerCPUPerOp = time.Duration(float64(srv1-srv0) / n)
	}
	res.CommandsPerOp = math.NaN()
	if cmdsOK && cmdsOK1 {
		res.CommandsPerOp = float64(cmds1-cmds0) / n
	}
	if sc.storm {
		res.Keys = int64(len(e.counts))
		for i := range e.counts {
			c := int64(e.counts[i].Load())
			res.Effects += c
			if c > 1 {
				res.DuplicateEffects += c - 1
			}
		}
	}
	res.Replays, res.Conflicts = e.replays.Load(), e.conflicts.Load()
	if e.effects.Load() != 0 && res.Keys == 0 {
		// A replay row ran its effect: the guard did not replay.
		return res, fmt.Errorf("bench: %s: %d effects ran where none should", scenario, e.effects.Load())
	}
	return res, nil
}

// warm has n workers ping at once before the clock starts, so the pool
// holds the connections the row will use and few operations pay for a dial.
func (t *Target) warm(ctx context.Context, n int) error {
	_, _, _, err := drive(ctx, n, int64(4*n), 0, func(ctx context.Context, _ int64) error {
		return t.client.Ping(ctx).Err()
	})
	if err != nil {
		return fmt.Errorf("redis does not answer: %w", err)
	}
	return nil
}

// op is one benchmarked operation; i numbers it from 0.
type op func(ctx context.Context, i int64) error

// drive runs op from conc workers until total operations ran (total > 0)
// or d passed, and returns what it measured. The first error stops it.
func drive(ctx context.Context, conc int, total int64, d time.Duration, fn op) (int64, time.Duration, Histogram, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	hists := make([]Histogram, conc)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := &hists[w]
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				if total > 0 && i >= total {
					return
				}
				t0 := time.Now()
				if total <= 0 && !t0.Before(deadline) {
					return
				}
				if err := fn(ctx, i); err != nil {
					cancel(err)
					return
				}
				h.Record(time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all Histogram
	for i := range hists {
		all.Merge(&hists[i])
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, errStop) {
		return 0, 0, Histogram{}, err
	}
	return int64(all.Count()), elapsed, all, nil
}
