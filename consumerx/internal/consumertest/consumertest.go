// Package consumertest holds what the consumerx adapter tests share: a
// guard on the real Redis under the test's own prefix, a poll with a
// deadline, and a record of delivery outcomes.
package consumertest

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Quiet is a logger that drops everything.
var Quiet = slog.New(slog.DiscardHandler)

// Guard returns a guard on the shared real Redis whose keys carry a prefix
// of the test's own, deleted when the test ends.
func Guard(t testing.TB, opts guard.Options) (*guard.Guard, *redis.Client, string) {
	t.Helper()
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	store := guard.NewRedisStore(rdb, guard.RedisOptions{Prefix: prefix})
	if err := store.LoadScripts(context.Background()); err != nil {
		t.Fatalf("load scripts: %v", err)
	}
	t.Cleanup(func() { DeleteKeys(rdb, prefix) })
	return guard.New(store, opts), rdb, prefix
}

// DeleteKeys deletes every key starting with prefix.
func DeleteKeys(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		rdb.Del(ctx, keys[:n]...)
		keys = keys[n:]
	}
}

// WaitFor polls cond until it holds, failing the test after limit.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
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
