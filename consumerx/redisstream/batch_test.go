package redisstream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// One XREADGROUP batch of 8 entries: one handler fails, one panics, one
// outlives its lease (it waits for its context, which MaxRun ends), one
// runs three leases (its lease kept alive); the others succeed. Every
// other entry is processed exactly once and acknowledged with the batch;
// the failed one runs again on attempt 2, the panicked one too (a panic
// is a failed attempt), the cut-off one on attempt 2; at the end nothing
// is pending.
func TestBatchFailPanicLongLease(t *testing.T) {
	// The lease is the test's unit of time: long enough that its extensions
	// (every Lease/3) are on time on a loaded machine (at 200ms, and at
	// 500ms, one came late under load: "lease lost: an extension succeeded
	// only after the lease's deadline", and the long entry ran again).
	const lease = time.Second
	e := newEnv(t, guard.Options{Lease: lease, MaxRun: 4 * lease})
	ctx := context.Background()
	stream := e.prefix + "orders"
	for i := range 8 {
		if err := e.rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"n", fmt.Sprint(i), "payload", fmt.Sprint("charge ", i)}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	const fails, panics, stuck, long = 1, 3, 5, 6
	var (
		mu       sync.Mutex
		runs     = map[int]int{}
		attempts = map[int][]int{}
		effects  [8]atomic.Int32
	)
	h := func(ctx context.Context, msg consumerx.Message) error {
		var i int
		fmt.Sscanf(msg.Metadata["n"], "%d", &i)
		l, _ := consumerx.LeaseFrom(ctx)
		mu.Lock()
		runs[i]++
		first := runs[i] == 1
		attempts[i] = append(attempts[i], l.Attempt)
		mu.Unlock()
		if first {
			switch i {
			case fails:
				return errors.New("gateway timeout")
			case panics:
				panic("nil map")
			case stuck:
				<-ctx.Done() // it outlives its lease: MaxRun cuts it off
				return context.Cause(ctx)
			case long:
				select {
				case <-ctx.Done():
					return context.Cause(ctx)
				case <-time.After(3 * lease):
				}
			}
		}
		effects[i].Add(1)
		return nil
	}
	var outs consumertest.Outcomes
	c := e.consumer(h, Options{Stream: stream, Group: "billing", Consumer: "c", Count: 8, Concurrency: 8,
		// The failed entries are taken over once the batch has ended (at
		// MaxRun, the cut-off one): the loop does not reclaim while a
		// batch runs.
		MinIdle: 2 * lease, ClaimEvery: 50 * time.Millisecond, Process: consumerx.Options{OnOutcome: outs.Hook}})
	stop := e.run(c)
	testenv.WaitFor(t, 30*time.Second, "every entry processed and acknowledged", func() bool {
		return outs.Final()[consumerx.Processed] == 8 && pending(t, e.rdb, stream, "billing") == 0
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	for i := range effects {
		if n := effects[i].Load(); n != 1 {
			t.Errorf("entry %d: %d effects", i, n)
		}
		want := "[1]"
		switch i {
		case fails, stuck, panics:
			want = "[1 2]"
		}
		if got := fmt.Sprint(attempts[i]); got != want {
			t.Errorf("entry %d ran on attempts %s, want %s", i, got, want)
		}
	}
	if all := outs.All(); all[consumerx.Processed] != 8 || all[consumerx.Failed] != 3 || all[consumerx.DeadLettered] != 0 {
		t.Errorf("deliveries %v; want 8 processed, 3 failed", all)
	}
}
