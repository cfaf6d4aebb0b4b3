// Package bench measures idemguard against plain Redis: the guard's fresh
// keys, replays and duplicate storms, its HTTP and consumer adapters, and
// baselines run in the same process, on the same server, at the same
// concurrency (SET NX + SET, GET, and the naive "GET, run, SET" pattern,
// whose duplicate side effects it counts), each plain and through go-redis's
// autopipeliner. Every guard row runs right after its baseline in the same
// transport mode (Plan), and its ratio is taken between the two.
//
// Each row reports throughput, latency quantiles from a log-linear
// Histogram, round trips and Redis commands per operation, client and
// server CPU per operation, allocations per operation and, for storms,
// effects per key. Target.Memory measures Redis memory per completed
// record. The idemguard command's bench subcommand prints the rows as a
// Markdown table with the load average and draws them with WriteChart.
package bench

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// TargetOptions say which Redis a Target measures. The zero value is an
// embedded miniredis.
type TargetOptions struct {
	// Addr is a Redis host:port. Empty starts an embedded miniredis in
	// this process (its allocations then count in allocs/op).
	Addr string
	// PoolSize is the go-redis connection pool size. Default 64; a run at
	// a higher concurrency should use at least as many connections (the
	// go-redis default, 10 per CPU, would cap the workers).
	PoolSize int
	// Prefix starts the name of every key a run writes. Default
	// "idemguard-bench:<random>:". Keys are removed after each row.
	Prefix string
}

// DefaultPoolSize is the connection pool size of a Target.
const DefaultPoolSize = 64

// Target is one Redis under measurement: every scenario of a run goes to
// the same server through the same client, so rows compare.
type Target struct {
	name   string
	client *redis.Client
	mr     *miniredis.Miniredis
	store  *guard.RedisStore
	prefix string
	trips  atomic.Int64
	rows   atomic.Int64
}

// Open connects to the Redis opts names (or starts a miniredis), checks it
// answers, and loads the guard's scripts.
func Open(ctx context.Context, opts TargetOptions) (*Target, error) {
	if opts.PoolSize < 0 {
		return nil, fmt.Errorf("bench: pool size %d is negative", opts.PoolSize)
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = DefaultPoolSize
	}
	if opts.Prefix == "" {
		opts.Prefix = "idemguard-bench:" + strings.ToLower(rand.Text()[:8]) + ":"
	}
	t := &Target{prefix: opts.Prefix}
	addr := opts.Addr
	if addr == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.Start(); err != nil {
			return nil, fmt.Errorf("bench: start miniredis: %w", err)
		}
		t.mr, addr, t.name = mr, mr.Addr(), "miniredis"
	} else {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("bench: redis address %q: %w", addr, err)
		}
		t.name = "redis " + addr
	}
	t.client = redis.NewClient(&redis.Options{
		Addr:          addr,
		PoolSize:      opts.PoolSize,
		DialTimeout:   2 * time.Second,
		DialerRetries: 1,
		// No CLIENT SETINFO on each new connection: round trips count ops only.
		DisableIdentity: true,
	})
	t.client.AddHook(tripCounter{&t.trips})
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := t.client.Ping(pctx).Err(); err != nil {
		t.Close()
		return nil, fmt.Errorf("bench: redis at %s does not answer: %w", addr, err)
	}
	t.store = t.newStore(guard.RedisOptions{Prefix: opts.Prefix})
	if err := t.store.LoadScripts(pctx); err != nil {
		t.Close()
		return nil, fmt.Errorf("bench: load scripts into %s: %w", addr, err)
	}
	return t, nil
}

// newStore returns a guard store on the target with options o; on
// miniredis its scripts go without their flag line (PlainScripts).
func (t *Target) newStore(o guard.RedisOptions) *guard.RedisStore {
	o.PlainScripts = t.mr != nil
	return guard.NewRedisStore(t.client, o)
}

// Name says which server the target is: "miniredis" or "redis ADDR".
func (t *Target) Name() string { return t.name }

// Client returns the target's Redis client.
func (t *Target) Client() *redis.Client { return t.client }

// Store returns the guard store on the target.
func (t *Target) Store() *guard.RedisStore { return t.store }

// Embedded reports whether the target is an in-process miniredis.
func (t *Target) Embedded() bool { return t.mr != nil }

// Close closes the client and stops an embedded server.
func (t *Target) Close() {
	_ = t.client.Close()
	if t.mr != nil {
		t.mr.Close()
	}
}

// rowPrefix returns a fresh key prefix for one row.
func (t *Target) rowPrefix() string {
	return t.prefix + strconv.FormatInt(t.rows.Add(1), 10) + ":"
}

// cleanup removes every key under prefix, outside the measured time.
func (t *Target) cleanup(ctx context.Context, prefix string) error {
	iter := t.client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	batch := make([]string, 0, 500)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := t.client.Unlink(ctx, batch...).Err()
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == cap(batch) {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	return flush()
}

// commands returns how many commands the server has executed, from INFO
// commandstats (which counts the commands a script calls, and the script
// call itself). The INFO calls are left out. ok is false when the server
// does not tell (miniredis has no commandstats).
func (t *Target) commands(ctx context.Context) (n int64, ok bool) {
	if t.mr != nil {
		return 0, false
	}
	info, err := t.client.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		name, stats, found := strings.Cut(line, ":")
		if !found || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return 0, false
		}
		n += c
	}
	return n, true
}

// serverCPU returns the CPU time the Redis server has used (INFO cpu:
// used_cpu_user + used_cpu_sys). ok is false when the server does not
// tell (miniredis).
func (t *Target) serverCPU(ctx context.Context) (d time.Duration, ok bool) {
	if t.mr != nil {
		return 0, false
	}
	info, err := t.client.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var total float64
	found := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, v, _ := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, false
			}
			total += f
			found++
		}
	}
	return time.Duration(total * float64(time.Second)), found == 2
}

// processCPU returns the CPU time (user + system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tripCounter is a go-redis hook counting round trips: one per command
// sent alone, one per pipeline.
type tripCounter struct{ n *atomic.Int64 }

func (h tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "hello", "auth", "select", "client":
			// A new connection's handshake, not the operation's.
		default:
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

var errStop = errors.New("bench: stopped")
