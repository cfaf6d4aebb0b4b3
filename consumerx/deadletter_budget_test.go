package consumerx_test

import (
	"context"
	"errors"
	"sync"
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
		o, err = redeliverPastLease(t, p, msg, fail, lease)
		if sent.Load() != 1 {
			t.Errorf("batch %v: dead letters sent %d, want 1 (last redelivery %s, %v)", batch, sent.Load(), o, err)
		}
	}
}

// redeliverPastLease delivers msg to p again and again (each answered
// dead-lettered, or in progress while a dead letter's record is pending)
// until three leases have passed, and returns the last answer: one that
// sent the dead letter a second time ends it early.
func redeliverPastLease(t *testing.T, p *consumerx.Processor, msg consumerx.Message, h consumerx.Handler, lease time.Duration) (o consumerx.Outcome, err error) {
	t.Helper()
	until := time.Now().Add(3 * lease)
	testenv.WaitFor(t, 20*time.Second, "redeliveries past the dead letter's lease", func() bool {
		o, err = p.Process(context.Background(), msg, h)
		return time.Now().After(until) || o != consumerx.DeadLettered && o != consumerx.InProgress
	})
	return o, err
}

// TestBatchSecondSlowDeadLetterRecordRetried: a batch of two messages on
// their last attempt. The first one's dead-letter record is refused for a
// moment (700 ms), and recorded on a try again; the second one's
// DeadLetter is a slow sink (longer than CompleteRetry), and its record is
// then refused for the same moment. It shared the batch's budget, which
// the first refusal had started and the slow hook spent: one try, refused,
// the message left Failed with its record pending, and its next delivery
// after the lease sent the dead letter a second time (Options.DeadLetter:
// "called once per (group, id, fingerprint)"). A dead letter's record now
// has CompleteRetry from its own refusal. Process, one budget per message,
// is the control.
func TestBatchSecondSlowDeadLetterRecordRetried(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	refuse := func() {
		if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "1").Err(); err != nil {
			t.Error(err)
		}
		// Redis refuses writes for a moment (a failover, a restart).
		time.AfterFunc(700*time.Millisecond, func() {
			if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
				t.Error(err)
			}
		})
	}
	var (
		mu    sync.Mutex
		sent  = map[string]int{}
		blips atomic.Int32
	)
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable {
			blips.Add(1)
		}
	})
	const lease = time.Second
	g := guard.New(guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), guard.Options{Lease: lease, Observer: obs})
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(ctx context.Context, msg consumerx.Message, _ error) error {
			if msg.Metadata["slow"] == "yes" {
				time.Sleep(consumerx.CompleteRetry + 300*time.Millisecond)
			}
			mu.Lock()
			sent[msg.ID]++
			n := sent[msg.ID]
			mu.Unlock()
			if n == 1 {
				refuse() // the dead letter's record is refused for a moment
			}
			return nil
		}})
	fail := func(context.Context, consumerx.Message) error { return errors.New("card declined") }
	ctx := context.Background()
	for _, batch := range []bool{false, true} {
		prefix := "single-"
		if batch {
			prefix = "batch-"
		}
		fast := consumerx.Message{ID: prefix + "fast", Payload: []byte("a")}
		slow := consumerx.Message{ID: prefix + "slow", Payload: []byte("b"), Metadata: map[string]string{"slow": "yes"}}
		blips.Store(0)
		var o consumerx.Outcome
		var err error
		if batch {
			res := p.ProcessBatch(ctx, []consumerx.Message{fast, slow}, fail, consumerx.BatchOptions{})
			if res[0].Outcome != consumerx.DeadLettered {
				t.Errorf("batch: first message %s, %v; want dead_lettered", res[0].Outcome, res[0].Err)
			}
			o, err = res[1].Outcome, res[1].Err
		} else {
			if o, err = p.Process(ctx, fast, fail); o != consumerx.DeadLettered {
				t.Errorf("single: first message %s, %v; want dead_lettered", o, err)
			}
			o, err = p.Process(ctx, slow, fail)
		}
		if blips.Load() < 2 {
			t.Fatalf("batch %v: %d refusals, want 2: the test tests nothing", batch, blips.Load())
		}
		if o != consumerx.DeadLettered {
			t.Errorf("batch %v: slow message %s, %v; want dead_lettered (its record refused for 700 ms)", batch, o, err)
		}
		o, err = redeliverPastLease(t, p, slow, fail, lease)
		mu.Lock()
		n := sent[slow.ID]
		mu.Unlock()
		if n != 1 {
			t.Errorf("batch %v: dead letters of the slow message sent %d, want 1 (last redelivery %s, %v)", batch, n, o, err)
		}
	}
}
