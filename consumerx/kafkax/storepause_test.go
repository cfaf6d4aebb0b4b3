package kafkax

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// The store stops answering mid-poll (a redis-server of the test's own,
// stopped with SIGSTOP after a handler's effect, for longer than the
// guard's lease but less than consumerx.CompleteRetry): the poll's
// completions, extensions and claims hang until their bounds, the
// completions are tried again, and once the store answers again every
// record is done once and committed, whatever the others' claims and
// leases went through meanwhile.
func TestStorePausedMidPoll(t *testing.T) {
	const n, lease, pause = 30, time.Second, 1500 * time.Millisecond
	srv := testenv.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	info, err := rdb.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid := 0
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ = strconv.Atoi(v)
		}
	}
	if pid == 0 {
		t.Fatal("no process_id in INFO server")
	}
	var resumed sync.Once
	resume := func() { resumed.Do(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) }
	t.Cleanup(resume)
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: lease})
	addrs, producer, _ := startKafka(t, "orders")
	manual := partitionProducer(t, addrs)
	var recs []*kgo.Record
	for i := range n {
		recs = append(recs, &kgo.Record{Topic: "orders", Partition: int32(i % 3), Value: fmt.Appendf(nil, "charge %d", i)})
	}
	var (
		mu      sync.Mutex
		effects = map[string]int{}
		runs    atomic.Int32
		paused  atomic.Bool
	)
	handler := func(_ context.Context, msg consumerx.Message) error {
		mu.Lock()
		effects[msg.ID]++
		mu.Unlock()
		if runs.Add(1) == 5 {
			// The store stops answering once this effect is made: its
			// completion, and every other call of the poll, meet it.
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Error(err)
			}
			paused.Store(true)
			time.AfterFunc(pause, resume) // the pause's length, not a synchronisation
		}
		return nil
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	c, err := New(cl, g, handler, Options{RetryDelay: 20 * time.Millisecond, MaxPollRecords: 6,
		Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	produceTogether(t, manual, recs...)
	testenv.WaitFor(t, 60*time.Second, "every record committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	if !paused.Load() {
		t.Fatal("the store was never paused: the test proves nothing")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range recs {
		if got := effects[ID(r)]; got != 1 {
			t.Errorf("%s (%s): %d effects, want 1", ID(r), r.Value, got)
		}
	}
}
