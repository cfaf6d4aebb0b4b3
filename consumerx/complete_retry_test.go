package consumerx_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// A handler that succeeded is recorded done even when the store refuses
// the completion for a moment (here: a primary that lost the replicas
// min-replicas-to-write asks for, until an operator lowers it): the completion is tried again with the lease the run
// holds, so the message is Processed and a redelivery is a Duplicate. (The
// message used to be Failed with its claim left pending; once the lease ran
// out the next delivery ran the effect a second time.)
func TestCompletionRetriedAfterStoreBlip(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	admin := srv.Client()
	var (
		ran  atomic.Bool  // the handler has made its effect
		blip atomic.Int32 // completions refused
	)
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable && ran.Load() && blip.Add(1) == 1 {
			// The operator's fix, heard as the refusal is reported.
			if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
				t.Error(err)
			}
		}
	})
	const lease = 300 * time.Millisecond
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: lease, Observer: obs})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	var effects atomic.Int32
	h := func(ctx context.Context, msg consumerx.Message) error {
		effects.Add(1)
		ran.Store(true)
		// Redis refuses writes after the claim, before the completion.
		return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
	}
	ctx := context.Background()
	for _, batch := range []bool{false, true} {
		effects.Store(0)
		ran.Store(false)
		blip.Store(0)
		msg := consumerx.Message{ID: "order-batch", Payload: []byte("charge")}
		var o consumerx.Outcome
		var err error
		if batch {
			r := p.ProcessBatch(ctx, []consumerx.Message{msg}, h, consumerx.BatchOptions{})[0]
			o, err = r.Outcome, r.Err
		} else {
			msg.ID = "order-single"
			o, err = p.Process(ctx, msg, h)
		}
		if blip.Load() == 0 {
			t.Fatalf("batch %v: the completion was not refused: the test does not test anything", batch)
		}
		if o != consumerx.Processed || err != nil {
			t.Errorf("batch %v: %s, %v; want processed", batch, o, err)
		}
		// A redelivery once the lease would have run out: the effect
		// does not run again.
		testenv.WaitFor(t, 10*time.Second, "the message no longer in progress", func() bool {
			o, err = p.Process(ctx, msg, func(context.Context, consumerx.Message) error {
				effects.Add(1)
				return nil
			})
			return o != consumerx.InProgress
		})
		if o != consumerx.Duplicate || effects.Load() != 1 {
			t.Errorf("batch %v: redelivery %s, %v, effects %d; want duplicate, 1 effect", batch, o, err, effects.Load())
		}
		if rec, err := g.Get(ctx, guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msg.ID}); err != nil || rec.State != guard.StateCompleted {
			t.Errorf("batch %v: record %+v, %v", batch, rec, err)
		}
	}
}
