package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// Consumers deliver overlapping batches of one set of messages at once,
// with keys repeated inside a batch, handlers that fail or panic at
// random, batches run one at a time, in order or concurrently, and
// consumers stopped at random mid-batch. No message's effect ever runs
// twice, a message is acknowledged only once its effect is recorded, and
// once the storm is over every message is processed or found done.
func TestBatchStormEffectsOnce(t *testing.T) {
	const ids, workers = 120, 6
	g, _, _ := consumertest.Guard(t, guard.Options{})
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: -1})
	var effects [ids]atomic.Int32
	msg := func(i int) consumerx.Message {
		return consumerx.Message{ID: fmt.Sprint("m", i), Payload: fmt.Appendf(nil, "charge %d", i)}
	}
	index := func(m consumerx.Message) int {
		var i int
		fmt.Sscanf(m.ID, "m%d", &i)
		return i
	}
	check := func(batch []consumerx.Message, res []consumerx.BatchResult) {
		for j, r := range res {
			i := index(batch[j])
			if r.Outcome.Ack() && effects[i].Load() != 1 {
				t.Errorf("%s acknowledged as %s with %d effects", batch[j].ID, r.Outcome, effects[i].Load())
			}
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for time.Now().Before(deadline) {
				batch := make([]consumerx.Message, 1+rng.IntN(12))
				for j := range batch {
					batch[j] = msg(rng.IntN(ids))
				}
				ctx, cancel := context.WithCancel(context.Background())
				stopAfter := -1
				if rng.IntN(3) == 0 {
					stopAfter = rng.IntN(len(batch) + 1) // the consumer stops after that many handler runs
				}
				var calls atomic.Int32
				h := func(hctx context.Context, m consumerx.Message) error {
					if int(calls.Add(1)) == stopAfter {
						cancel()
					}
					switch roll := rand.IntN(10); {
					case roll == 0:
						return errors.New("gateway timeout")
					case roll == 1:
						panic("nil map")
					case roll == 2 && hctx.Err() != nil:
						return hctx.Err()
					}
					if n := effects[index(m)].Add(1); n != 1 {
						t.Errorf("%s: effect %d", m.ID, n)
					}
					return nil
				}
				if stopAfter == 0 {
					cancel()
				}
				opts := consumerx.BatchOptions{Concurrency: rng.IntN(4), Ordered: rng.IntN(3) == 0}
				check(batch, p.ProcessBatch(ctx, batch, h, opts))
				cancel()
			}
		})
	}
	wg.Wait()
	// The storm is over: every message comes back until it is acknowledged.
	all := make([]consumerx.Message, ids)
	for i := range all {
		all[i] = msg(i)
	}
	testenv.WaitFor(t, 30*time.Second, "every message acknowledged", func() bool {
		res := p.ProcessBatch(context.Background(), all, func(_ context.Context, m consumerx.Message) error {
			if n := effects[index(m)].Add(1); n != 1 {
				t.Errorf("%s: effect %d", m.ID, n)
			}
			return nil
		}, consumerx.BatchOptions{Concurrency: 4})
		check(all, res)
		var left []consumerx.Message
		for j, r := range res {
			if !r.Outcome.Ack() {
				left = append(left, all[j])
			}
		}
		all = left
		return len(all) == 0
	})
	for i := range effects {
		if n := effects[i].Load(); n != 1 {
			t.Errorf("m%d: %d effects, want 1", i, n)
		}
	}
}
