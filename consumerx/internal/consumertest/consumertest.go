// Package consumertest holds what the consumerx adapter tests share: a
// guard on the real Redis under the test's own prefix, a poll with a
// deadline, and a record of delivery outcomes.
package consumertest

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// Guard returns a guard on the shared real Redis whose keys carry a prefix
// of the test's own, deleted when the test ends (DeleteKeysAtEnd).
func Guard(t testing.TB, opts guard.Options) (*guard.Guard, *redis.Client, string) {
	t.Helper()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	DeleteKeysAtEnd(t, rdb, prefix)
	store := guardenv.StoreOn(t, rdb, guard.RedisOptions{Prefix: prefix})
	return guard.New(store, opts), rdb, prefix
}

// DeleteKeysAtEnd deletes, when the test ends, every key starting with
// prefix that a command sent through rdb from now on named. It keeps the
// names rather than scan for them: a SCAN of the shared server's whole
// keyspace costs as much as every other test's records there (a dev
// server kept up across runs held 536k: seconds for each test), and keeps
// the server from answering the others meanwhile.
func DeleteKeysAtEnd(t testing.TB, rdb *redis.Client, prefix string) {
	w := &written{prefix: prefix, names: map[string]struct{}{}}
	rdb.AddHook(w)
	t.Cleanup(func() {
		w.mu.Lock()
		names := make([]string, 0, len(w.names))
		for n := range w.names {
			names = append(names, n)
		}
		w.mu.Unlock()
		for len(names) > 0 {
			n := min(len(names), 500)
			rdb.Unlink(context.Background(), names[:n]...)
			names = names[n:]
		}
	})
}

// written is a hook that keeps the names under prefix its client's
// commands named.
type written struct {
	prefix string
	mu     sync.Mutex
	names  map[string]struct{}
}

func (w *written) note(cmd redis.Cmder) {
	for _, a := range cmd.Args() {
		var name string
		switch a := a.(type) {
		case string:
			name = a
		case *string: // the store's arguments, made without boxing
			name = *a
		case []byte:
			name = string(a)
		default:
			continue
		}
		if strings.HasPrefix(name, w.prefix) {
			w.mu.Lock()
			w.names[name] = struct{}{}
			w.mu.Unlock()
		}
	}
}

func (w *written) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w *written) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		w.note(cmd)
		return next(ctx, cmd)
	}
}

func (w *written) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			w.note(cmd)
		}
		return next(ctx, cmds)
	}
}

// Outcomes records every delivery's outcome per delivery id (the id the
// test names it by: a stream entry, a UUID, a sequence).
type Outcomes struct {
	ID  func(consumerx.Message) string // which id to record by; default Message.ID
	mu  sync.Mutex
	per map[string][]consumerx.Outcome
	all map[consumerx.Outcome]int
}

// Hook is a consumerx.Options.OnOutcome.
func (o *Outcomes) Hook(_ context.Context, msg consumerx.Message, out consumerx.Outcome, _ error) {
	id := msg.ID
	if o.ID != nil {
		id = o.ID(msg)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.per == nil {
		o.per, o.all = map[string][]consumerx.Outcome{}, map[consumerx.Outcome]int{}
	}
	o.per[id] = append(o.per[id], out)
	o.all[out]++
}

// Final counts delivery ids by their last acknowledging outcome; ids
// never acknowledged are not counted. (A later non-acknowledging outcome
// does not undo an ack: an entry reclaimed while its holder still ran it
// is in progress for the reclaimer and then acknowledged by the holder.)
func (o *Outcomes) Final() map[consumerx.Outcome]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := map[consumerx.Outcome]int{}
	for _, outs := range o.per {
		for i := len(outs) - 1; i >= 0; i-- {
			if outs[i].Ack() {
				n[outs[i]]++
				break
			}
		}
	}
	return n
}

// Entries returns the outcomes of each delivery id, in order.
func (o *Outcomes) Entries() map[string][]consumerx.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string][]consumerx.Outcome, len(o.per))
	for k, v := range o.per {
		m[k] = append([]consumerx.Outcome(nil), v...)
	}
	return m
}

// All counts every delivery by outcome.
func (o *Outcomes) All() map[consumerx.Outcome]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := make(map[consumerx.Outcome]int, len(o.all))
	for k, v := range o.all {
		n[k] = v
	}
	return n
}

// Interrupted is a handler whose first N runs stand for a consumer
// stopped mid-handler: each announces itself on Started, waits until its
// context ends (the consumer's shutdown cancels it) and returns the
// context's error, as a well-behaved handler does. Later runs make the
// effect (counted in Effects) and succeed.
type Interrupted struct {
	N       int32
	Started chan int32 // receives the run's number; make it with room for N
	runs    atomic.Int32
	Effects atomic.Int32
}

// NewInterrupted returns an Interrupted whose first n runs are stopped.
func NewInterrupted(n int32) *Interrupted {
	return &Interrupted{N: n, Started: make(chan int32, n)}
}

// Handle is the consumerx.Handler.
func (h *Interrupted) Handle(ctx context.Context, _ consumerx.Message) error {
	n := h.runs.Add(1)
	if n <= h.N {
		h.Started <- n
		<-ctx.Done()
		return ctx.Err()
	}
	h.Effects.Add(1)
	return nil
}

// Runs is how often the handler was called.
func (h *Interrupted) Runs() int32 { return h.runs.Load() }

// WaitStarted waits for the next stopped run to begin, failing the test
// after limit.
func (h *Interrupted) WaitStarted(t testing.TB, limit time.Duration) int32 {
	t.Helper()
	select {
	case n := <-h.Started:
		return n
	case <-time.After(limit):
		t.Fatalf("no handler run began within %s", limit)
		return 0
	}
}

// Meter measures a benchmark's run: wall time, this process's CPU time
// and, when rdb is given, the Redis server's, so that the cost of each
// message shows apart from how loaded the machine is.
type Meter struct {
	rdb       *redis.Client
	start     time.Time
	cpu, rcpu time.Duration
	mallocs   uint64
	reads     int64 // the server's total_reads_processed
}

// StartMeter starts measuring; rdb may be nil (no Redis in the run).
func StartMeter(rdb *redis.Client) *Meter {
	m := &Meter{rdb: rdb, rcpu: redisCPU(rdb), reads: redisReads(rdb)}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.mallocs = ms.Mallocs
	m.cpu, m.start = processCPU(), time.Now()
	return m
}

// Report stops measuring n messages and reports msgs/s, CPU microseconds
// per message, of this process (client-µs/msg: the adapter, the guard and
// the broker's client; an embedded broker's too) and of Redis
// (redis-µs/msg), the reads of requests Redis made per message
// (redis-reads/msg: how well its round trips are shared; 1/16 is one
// read per batch of 16), and heap allocations per message to two
// decimals (allocs/msg; allocs/op rounds down).
func (m *Meter) Report(b *testing.B, n int) {
	elapsed, cpu := time.Since(m.start), processCPU()-m.cpu
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.Mallocs-m.mallocs)/float64(n), "allocs/msg")
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "client-µs/msg")
	if m.rdb != nil {
		b.ReportMetric(float64((redisCPU(m.rdb)-m.rcpu).Microseconds())/float64(n), "redis-µs/msg")
		b.ReportMetric(float64(redisReads(m.rdb)-m.reads)/float64(n), "redis-reads/msg")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisReads is the server's total_reads_processed (INFO stats): how many
// times it read requests from a connection. Or 0.
func redisReads(rdb *redis.Client) int64 {
	if rdb == nil {
		return 0
	}
	info, err := rdb.Info(context.Background(), "stats").Result()
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_reads_processed:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// redisCPU is the server's CPU time (INFO cpu), or 0.
func redisCPU(rdb *redis.Client) time.Duration {
	if rdb == nil {
		return 0
	}
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		name, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// Plain runs a batch through the bare handler, one message after another:
// the adapters' loops without the guard, for their benchmarks.
func Plain(h consumerx.Handler) func(context.Context, []consumerx.Message) []consumerx.BatchResult {
	return func(ctx context.Context, msgs []consumerx.Message) []consumerx.BatchResult {
		res := make([]consumerx.BatchResult, len(msgs))
		for i := range msgs {
			if err := h(ctx, msgs[i]); err != nil {
				res[i] = consumerx.BatchResult{Outcome: consumerx.Failed, Err: err}
				continue
			}
			res[i].Outcome = consumerx.Processed
		}
		return res
	}
}

// Floor wraps inner, a batch's unguarded handling, in the native Redis
// writes no guard can do with less: one pipeline of SET NX PX, a key per
// message, before it, and one of SET PX after. The adapters' benchmarks
// run it as their floor rows: a guarded row's ratio to plain set beside
// the most any guard making these two round trips per batch could reach.
// inner runs once whatever Redis answers, so a benchmark's run still ends;
// an error of the writes fails tb, unless the batch's context had ended.
func Floor[R any](tb testing.TB, rdb redis.Cmdable, prefix string, inner func(context.Context, []consumerx.Message) R) func(context.Context, []consumerx.Message) R {
	return func(ctx context.Context, msgs []consumerx.Message) R {
		var r R
		if err := floorWrites(ctx, rdb, prefix, msgs, func() { r = inner(ctx, msgs) }); err != nil && ctx.Err() == nil {
			tb.Error(err)
		}
		return r
	}
}

// floorWrites runs run between Floor's two pipelines.
func floorWrites(ctx context.Context, rdb redis.Cmdable, prefix string, msgs []consumerx.Message, run func()) error {
	claims, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range msgs {
			p.SetNX(ctx, prefix+"floor:"+msgs[i].ID, "token", 30*time.Second)
		}
		return nil
	})
	for i, c := range claims {
		if err == nil && !c.(*redis.BoolCmd).Val() {
			err = fmt.Errorf("floor: message %s was claimed before", msgs[i].ID)
		}
	}
	run()
	if err != nil {
		return err
	}
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range msgs {
			p.Set(ctx, prefix+"floor:"+msgs[i].ID, "processed", time.Hour)
		}
		return nil
	})
	return err
}
