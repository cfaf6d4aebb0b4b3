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

// A dead letter that was sent is recorded even when the store refuses
// the record's completion for a moment (a primary that lost the replicas
// min-replicas-to-write asks for, until an operator lowers it), as a
// handler's success is: the message is DeadLettered (acknowledged) and
// its redeliveries do not send it again. (It was Failed with the
// dead-letter record left pending; once that lease ran out the next
// delivery called DeadLetter a second time.)
func TestDeadLetterCompletionRetriedAfterStoreBlip(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	var (
		sent atomic.Int32 // dead letters sent
		blip atomic.Int32 // completions refused after one was sent
	)
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable && sent.Load() > 0 && blip.Add(1) == 1 {
			// The operator's fix, heard as the refusal is reported.
			if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
				t.Error(err)
			}
		}
	})
	// Long enough that the dead letter's claim outlives the DeadLetter's
	// CONFIG SET on a loaded machine (its extensions are refused once
	// Redis refuses writes), short enough that the redeliveries below
	// outlast it.
	const lease = time.Second
	g := guard.New(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), guard.Options{Lease: lease, Observer: obs})
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(ctx context.Context, _ consumerx.Message, _ error) error {
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
		if o != consumerx.DeadLettered || !errors.Is(err, guard.ErrExhausted) {
			t.Errorf("batch %v: %s, %v; want dead-lettered", batch, o, err)
		}
		// Redeliveries until the dead letter's lease would have run out.
		until := time.Now().Add(3 * lease)
		testenv.WaitFor(t, 10*time.Second, "redeliveries past the dead letter's lease", func() bool {
			o, err = p.Process(ctx, msg, fail)
			return time.Now().After(until) || o != consumerx.DeadLettered && o != consumerx.InProgress
		})
		if o != consumerx.DeadLettered || sent.Load() != 1 {
			t.Errorf("batch %v: last redelivery %s, %v; dead letters sent %d, want dead-lettered, 1", batch, o, err, sent.Load())
		}
	}
}
