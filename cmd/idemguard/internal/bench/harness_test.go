package bench

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Options.Work says: "how long each business effect takes in the storm,
// HTTP and consumer scenarios". The consumer rows (consumer-plain and its
// guard row consumer) run a handler that returns at once whatever Work
// is, so `idemguard bench --work 5ms --scenario consumer` reports a
// consumer row with no business effect at all. One op of these rows
// handles ConsumerBatch messages, one at a time (ProcessBatch's default
// and the plain loop's), so with Work set an op takes at least Work.
func TestConsumerRowsRunWork(t *testing.T) {
	tg := openRedis(t)
	const work = 20 * time.Millisecond
	for _, s := range []string{ConsumerPlain, Consumer, ConsumerStorm} {
		r, err := tg.Run(context.Background(), s, Options{Concurrency: 1, Ops: 1, Keys: 1, Duplicates: 1, Work: work})
		if err != nil {
			t.Fatal(err)
		}
		if p50 := r.Latency.Quantile(0.5); p50 < work {
			t.Errorf("%s with Work %v: an op took %v (elapsed %v): its effects did not take Work", s, work, p50, r.Elapsed)
		}
	}
}

// Options.TTL says: "TTL is the retention of every key written. Default 2
// minutes: a benchmark leaves nothing behind for long even if its
// clean-up is cut." Every scenario is prepared and run for a few ops, and
// every key it wrote is read before the row's clean-up: each must expire.
func TestEveryKeyExpires(t *testing.T) {
	tg := openRedis(t)
	ctx := context.Background()
	opts := Options{Concurrency: 2, Keys: 4, Duplicates: 2, TTL: time.Minute}.withDefaults()
	for _, name := range Scenarios() {
		sc, _ := lookup(name)
		e := &env{t: tg, opts: opts, prefix: tg.rowPrefix()}
		func() {
			defer func() {
				_ = tg.cleanup(ctx, e.prefix)
				if e.close != nil {
					e.close()
				}
			}()
			fn, err := sc.prepare(ctx, e)
			if err != nil {
				t.Fatalf("%s: prepare: %v", name, err)
			}
			if sc.storm {
				e.counts = make([]atomic.Int32, opts.Keys)
			}
			n := int64(4)
			if sc.storm {
				n = int64(opts.Keys * opts.Duplicates)
			}
			for i := range n {
				if err := fn(ctx, i); err != nil {
					t.Fatalf("%s: op %d: %v", name, i, err)
				}
			}
			keys, err := tg.client.Keys(ctx, e.prefix+"*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(keys) == 0 && name != HTTPPlain { // http-plain touches no Redis
				t.Errorf("%s wrote no key under its prefix", name)
			}
			for _, k := range keys {
				ttl, err := tg.client.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl < 0 || ttl > opts.TTL+guard.DefaultLease {
					t.Errorf("%s: key %s has PTTL %v, want at most Options.TTL %v (+ a lease)", name, strings.TrimPrefix(k, e.prefix), ttl, opts.TTL)
				}
			}
		}()
	}
}

// persistConns counts the HTTP client connections of this process held
// open (a keep-alive connection has a readLoop goroutine).
func persistConns() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "net/http.(*persistConn).readLoop(")
}

// The rows of a pair start their measured window alike, with no HTTP
// connection open: http-replay (its preload POSTs through the row's own
// client) started it with every worker's keep-alive connection already
// dialled and served, while its baseline http-plain (and http,
// http-get-auto, http-setnx+set-auto) dials and accepts them inside the
// window, where ops/s, client CPU/op, allocs/op and the first ops'
// latency count them. (The preload's last connection goes back to the
// transport, which closes it, a moment after its response was read: the
// count is waited for, not read once; it was, and failed in make test.)
func TestHTTPPairsStartAlike(t *testing.T) {
	tg := openRedis(t)
	ctx := context.Background()
	opts := Options{Concurrency: 8, Keys: 16}.withDefaults()
	for _, name := range []string{HTTPPlain, HTTPReplay, HTTP, HTTPGetAuto} {
		sc, _ := lookup(name)
		e := &env{t: tg, opts: opts, prefix: tg.rowPrefix()}
		before := persistConns()
		if _, err := sc.prepare(ctx, e); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// What Run has when its clock starts.
		testenv.WaitFor(t, 5*time.Second, name+" to start with no HTTP connection open", func() bool { return persistConns() <= before })
		_ = tg.cleanup(ctx, e.prefix)
		if e.close != nil {
			e.close()
		}
	}
}

// The CLI prints "× baseline: the median over the rounds of each guard
// row's throughput over its baseline's"; Median's doc: "Ratio the median
// of the rounds' ratios". With an even number of rounds the median of
// the ratios is the mean of the middle two; Median reports the lower one,
// so with --rounds 2 the "median" is always the worse round (the low end
// of its own bracket).
func TestMedianOfEvenRounds(t *testing.T) {
	row := func(s string, ops int64, ratio float64) Result {
		return Result{Scenario: s, Concurrency: 64, Ops: ops, Elapsed: time.Second, Ratio: ratio}
	}
	m := Median([][]Result{
		{row(GetAuto, 100, 0), row(Replay, 50, 0.5)},
		{row(GetAuto, 100, 0), row(Replay, 90, 0.9)},
	})
	if got := m[1].Ratio; got < 0.69 || got > 0.71 {
		t.Errorf("median of the ratios 0.5 and 0.9 reported as %v (bracket %v–%v), want 0.7", got, m[1].RatioLow, m[1].RatioHigh)
	}
}

// A row's keys outlive it: a TTL not longer than the row's Duration is
// refused (the replay rows' stored results and the consumer rows' stream
// expired during the run, which failed with NOGROUP or misses), and the
// default TTL grows with a long Duration.
func TestTTLOutlivesRow(t *testing.T) {
	if err := (Options{Duration: 1500 * time.Millisecond, TTL: 500 * time.Millisecond}).Validate(); err == nil {
		t.Error("Validate of a 500ms TTL for 1.5s rows: nil, want an error")
	}
	if err := (Options{Ops: 100, TTL: 500 * time.Millisecond}).Validate(); err != nil {
		t.Errorf("Validate of a 500ms TTL for rows of 100 ops: %v", err)
	}
	if o := (Options{Duration: 3 * time.Minute}).withDefaults(); o.TTL <= o.Duration {
		t.Errorf("default TTL %s for 3m rows, want it longer", o.TTL)
	}
}
