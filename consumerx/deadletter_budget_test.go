package consumerx_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// TestBatchSlowDeadLetterRecordRetried: a batch's dead letter whose
// DeadLetter takes longer than CompleteRetry (a slow sink), and whose
// record the store then refuses for a moment, is recorded again, as
// Process records it. The budget of a batch's completions ran from the end
// of DoBatch, so the hook had spent it before any refusal: the message was
// Failed, its dead-letter record left pending, and the next delivery after
// its lease sent the dead letter a second time. The budget starts at the
// first refusal now. (Process, with a budget of its own, is the control.)
func TestBatchSlowDeadLetterRecordRetried(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	var (
		sent atomic.Int32
		blip atomic.Int32
	)
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable && sent.Load() > 0 && blip.Add(1) == 1 {
			if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
				t.Error(err)
			}
		}
	})
	const lease = time.Second
	g := guard.New(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), guard.Options{Lease: lease, Observer: obs})
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(ctx context.Context, _ consumerx.Message, _ error) error {
			// A sink slower than CompleteRetry.
			time.Sleep(consumerx.CompleteRetry + 300*time.Millisecond)
			sent.Add(1)
			// Redis refuses writes from now on: the dead letter's record.
			return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
		}})
	fail := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	ctx := context.Background()
	for _, batch := range []bool{false, true} {
		sent.Store(0)
		blip.Store(0)
		if err := admin.ConfigSet(ctx, "min-replicas-to-write", "0").Err(); err != nil {
			t.Fatal(err)
		}
		msg := consumerx.Message{ID: "order-single", Payload: []byte("charge")}
		var o consumerx.Outcome
		var err error
		if batch {
			msg.ID = "order-batch"
			r := p.ProcessBatch(ctx, []consumerx.Message{msg}, fail, consumerx.BatchOptions{})[0]
			o, err = r.Outcome, r.Err
		} else {
			o, err = p.Process(ctx, msg, fail)
		}
		if blip.Load() == 0 {
			t.Fatalf("batch %v: the dead letter's completion was not refused: the test tests nothing (%s, %v)", batch, o, err)
		}
		if o != consumerx.DeadLettered {
			t.Errorf("batch %v: %s, %v; want dead_lettered", batch, o, err)
		}
		until := time.Now().Add(3 * lease)
		testenv.WaitFor(t, 20*time.Second, "redeliveries past the dead letter's lease", func() bool {
			o, err = p.Process(ctx, msg, fail)
			return time.Now().After(until) || o != consumerx.DeadLettered && o != consumerx.InProgress
		})
		if sent.Load() != 1 {
			t.Errorf("batch %v: dead letters sent %d, want 1 (last redelivery %s, %v)", batch, sent.Load(), o, err)
		}
	}
}
