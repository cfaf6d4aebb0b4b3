package consumerx_test

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
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

// A handler that succeeded is recorded done even when the store refuses
// the completion for a moment (here: a primary that lost the replicas
// min-replicas-to-write asks for, until an operator lowers it): the completion is tried again with the lease the run
// holds, so the message is Processed and a redelivery is a Duplicate. (The
// message used to be Failed with its claim left pending; once the lease ran
// out the next delivery ran the effect a second time.) The Observer hears
// the completion the retry recorded.
func TestCompletionRetriedAfterStoreBlip(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := srv.Client()
	admin := srv.Client()
	var (
		ran       atomic.Bool  // the handler has made its effect
		blip      atomic.Int32 // completions refused
		completed sync.Map     // message id → *atomic.Int32: EventCompleted heard
	)
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventCompleted {
			n, _ := completed.LoadOrStore(e.Key.ID, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
		if e.Kind == guard.EventUnavailable && ran.Load() && blip.Add(1) == 1 {
			// The operator's fix, heard as the refusal is reported.
			if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
				t.Error(err)
			}
		}
	})
	// Long enough that the claim outlives the handler's CONFIG SET on a
	// loaded machine (its extensions are refused once Redis refuses
	// writes); a redelivery of a message left pending waits it out.
	const lease = time.Second
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
		// The Observer hears the completion the retry recorded (it heard
		// only the refusal: metrics showed the effect acquired and never
		// completed, otelx's span an unavailable outcome).
		heard := int32(0)
		if n, ok := completed.Load(msg.ID); ok {
			heard = n.(*atomic.Int32).Load()
		}
		if heard != 1 {
			t.Errorf("batch %v: the Observer heard %d completions, want 1", batch, heard)
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

// lateStore is a Redis store without batches of its own (a batch's
// completions are tried again one at a time) whose Complete of key, once
// armed (the batch's first completions were refused) and called with
// less than lateWindow of its caller's deadline left, lifts the refusal
// of writes and answers just after that deadline: a store back at the
// very end of the time a completion is retried for, answering late.
type lateStore struct {
	guard.Store
	key   guard.Key
	admin *redis.Client
	armed atomic.Bool
	late  atomic.Bool
}

// lateWindow is wide enough to take one of the last tries of a
// completion, which back off to 500ms apart: with a window of 150ms, a
// try answered late on a loaded machine left none inside it, and the
// store never came back.
const lateWindow = 900 * time.Millisecond

func (s *lateStore) Complete(ctx context.Context, l guard.Lease, result []byte, ttl time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && s.armed.Load() && l.Key == s.key && time.Until(dl) < lateWindow && !s.late.Swap(true) {
		if err := s.admin.ConfigSet(context.WithoutCancel(ctx), "min-replicas-to-write", "0").Err(); err != nil {
			return err
		}
		<-ctx.Done()
		return s.Store.Complete(context.WithoutCancel(ctx), l, result, ttl)
	}
	return s.Store.Complete(ctx, l, result, ttl)
}

// The completions of a batch share CompleteRetry; over a store without
// batches (tried again one at a time), one that used it up but was taken
// by the store at its end does not leave the next message of the batch
// without a try: the store is back, and that message's success is
// recorded too. (The next message got no try at all: it was left Failed
// with its claim pending, and its next delivery after the lease ran its
// effect a second time.)
func TestCompletionRetrySharedByBatchTriesEachOnce(t *testing.T) {
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	msgs := batchOf(2)
	const lease = time.Second // m1's claim outlives m0's and m1's CONFIG SET on a loaded machine
	s := &lateStore{Store: guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), admin: admin,
		key: guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msgs[0].ID}}
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable {
			s.armed.Store(true) // the batch's completions were refused: what comes now are the tries again
		}
	})
	g := guard.New(s, guard.Options{Lease: lease, Observer: obs})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	var effects [2]atomic.Int32
	h := func(ctx context.Context, msg consumerx.Message) error {
		var i int
		fmt.Sscanf(msg.ID, "m%d", &i)
		effects[i].Add(1)
		// Redis refuses writes from now on: the batch's completions.
		return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
	}
	ctx := context.Background()
	res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
	if !s.late.Load() {
		t.Fatalf("the store did not come back at the end of the retries: the test tests nothing; %+v", res)
	}
	for i, r := range res {
		if r.Outcome != consumerx.Processed || r.Err != nil {
			t.Errorf("message %d: %s, %v; want processed", i, r.Outcome, r.Err)
		}
	}
	for i, msg := range msgs {
		var o consumerx.Outcome
		var err error
		testenv.WaitFor(t, 10*time.Second, "the message no longer in progress", func() bool {
			o, err = p.Process(ctx, msg, func(context.Context, consumerx.Message) error {
				effects[i].Add(1)
				return nil
			})
			return o != consumerx.InProgress
		})
		if o != consumerx.Duplicate || effects[i].Load() != 1 {
			t.Errorf("message %d: redelivery %s, %v, effects %d; want duplicate, 1 effect", i, o, err, effects[i].Load())
		}
	}
}

// A slow DeadLetter of an earlier message of a batch does not use up the
// time its completions are tried again for (they are tried first). Here m0 is exhausted and its dead letter takes
// longer than CompleteRetry (a sink that answers slowly); m1 succeeded,
// the store refused its completion for a moment and is back. m1 is
// Processed and its redelivery a Duplicate. (m1 got no try at all: left
// Failed with its claim pending, its next delivery after the lease ran
// the effect a second time.)
func TestCompletionRetryNotSpentOnSlowDeadLetter(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, admin := srv.Client(), srv.Client()
	var (
		ran  atomic.Bool  // m1's handler has made its effect
		blip atomic.Int32 // completions refused
	)
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable && ran.Load() && blip.Add(1) == 1 {
			if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
				t.Error(err)
			}
		}
	})
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: 5 * time.Second, Observer: obs})
	msgs := batchOf(2)
	ctx := context.Background()
	// m0 used its one attempt (dead-lettered then by a processor without
	// a DeadLetter: nothing recorded of it).
	p0 := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1})
	if o, _ := p0.Process(ctx, msgs[0], func(context.Context, consumerx.Message) error { return errors.New("declined") }); o != consumerx.DeadLettered {
		t.Fatalf("m0's first delivery: %s", o)
	}
	var dead atomic.Int32
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			dead.Add(1)
			// A dead-letter sink slower than CompleteRetry.
			t := time.NewTimer(consumerx.CompleteRetry + 200*time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}})
	var effects atomic.Int32
	h := func(ctx context.Context, msg consumerx.Message) error {
		effects.Add(1)
		ran.Store(true)
		// Redis refuses writes after the claim, before the completion.
		return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
	}
	res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
	if blip.Load() == 0 || dead.Load() != 1 {
		t.Fatalf("refusals %d, dead letters %d: the test tests nothing; %+v", blip.Load(), dead.Load(), res)
	}
	if res[0].Outcome != consumerx.DeadLettered {
		t.Errorf("m0: %s, %v; want dead_lettered", res[0].Outcome, res[0].Err)
	}
	if res[1].Outcome != consumerx.Processed || res[1].Err != nil {
		t.Errorf("m1: %s, %v; want processed", res[1].Outcome, res[1].Err)
	}
	var o consumerx.Outcome
	testenv.WaitFor(t, 15*time.Second, "m1 no longer in progress", func() bool {
		o, _ = p.Process(ctx, msgs[1], func(context.Context, consumerx.Message) error {
			effects.Add(1)
			return nil
		})
		return o != consumerx.InProgress
	})
	if o != consumerx.Duplicate || effects.Load() != 1 {
		t.Errorf("m1's redelivery: %s, effects %d; want duplicate, 1 effect", o, effects.Load())
	}
}

// A batch's completions the store refused are tried again before any dead
// letter of the batch is sent: the user's DeadLetter may take longer than
// a lease, and those claims are no longer extended. Here m0 is exhausted
// and its dead letter runs until another consumer's delivery of m1 is no
// longer in progress; m1 succeeded and the store refused its completion
// for a moment. m1 is Processed, and the other consumer's delivery a
// Duplicate. (m1's completion was tried again only after the dead letter:
// by then its lease had run out, the other consumer had run the effect a
// second time, and m1 was Failed.)
func TestBatchCompletionsRetriedBeforeDeadLetters(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb, admin := srv.Client(), srv.Client()
	var (
		ran  atomic.Bool
		blip atomic.Int32
	)
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable && ran.Load() && blip.Add(1) == 1 {
			if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
				t.Error(err)
			}
		}
	})
	const lease = time.Second // m1's claim outlives its handler's CONFIG SET on a loaded machine
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: lease, Observer: obs})
	msgs := batchOf(2)
	ctx := context.Background()
	p0 := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1})
	if o, _ := p0.Process(ctx, msgs[0], func(context.Context, consumerx.Message) error { return errors.New("declined") }); o != consumerx.DeadLettered {
		t.Fatalf("m0's first delivery: %s", o)
	}
	var effects atomic.Int32
	other := newProcessor(t, g, "billing", consumerx.Options{})
	var otherOutcome consumerx.Outcome
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			// A slow dead-letter sink: meanwhile another consumer gets m1.
			testenv.WaitFor(t, 10*lease, "the other consumer's delivery of m1 no longer in progress", func() bool {
				otherOutcome, _ = other.Process(ctx, msgs[1], func(context.Context, consumerx.Message) error {
					effects.Add(1)
					return nil
				})
				return otherOutcome != consumerx.InProgress
			})
			return nil
		}})
	h := func(ctx context.Context, msg consumerx.Message) error {
		effects.Add(1)
		ran.Store(true)
		return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
	}
	res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
	if blip.Load() == 0 {
		t.Fatalf("the completion was not refused: the test tests nothing; %+v", res)
	}
	if res[0].Outcome != consumerx.DeadLettered {
		t.Errorf("m0: %s, %v; want dead_lettered", res[0].Outcome, res[0].Err)
	}
	if res[1].Outcome != consumerx.Processed || res[1].Err != nil {
		t.Errorf("m1: %s, %v; want processed", res[1].Outcome, res[1].Err)
	}
	if otherOutcome != consumerx.Duplicate || effects.Load() != 1 {
		t.Errorf("the other consumer's m1: %s, effects %d; want duplicate, 1 effect", otherOutcome, effects.Load())
	}
}

// The completions of a batch the store refused are tried again within
// CompleteRetry, paced per refusal, not per message: once the store is
// back, the rest go one after another without a pause. Here a batch of 100
// succeeds, the store refuses every completion and is back a quarter of
// the budget later: every message is Processed and recorded, and ProcessBatch
// returns within the budget. (Each completion waited 20ms before its try
// even when the one before it had just been taken: a batch of 100 spent
// 2s on pauses alone, past the budget, the later messages left one try
// each.)
func TestBatchCompletionRetriesPacedPerRefusal(t *testing.T) {
	const n = 100
	srv := testenv.StartRedis(t)
	rdb, admin := srv.Client(), srv.Client()
	var (
		ran     atomic.Bool  // the batch's last handler has run
		refused atomic.Int64 // when the store first refused a completion (unix ns)
	)
	back := make(chan struct{})
	obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
		if e.Kind == guard.EventUnavailable && ran.Load() && refused.CompareAndSwap(0, time.Now().UnixNano()) {
			// The outage lasts a quarter of the budget after the refusal.
			tm := time.AfterFunc(consumerx.CompleteRetry/4, func() {
				defer close(back)
				if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
					t.Error(err)
				}
			})
			t.Cleanup(func() { tm.Stop() })
		}
	})
	// Leases outlive the whole batch and its retries on a loaded machine.
	g := guard.New(guardenv.StoreOn(t, rdb, guard.RedisOptions{}), guard.Options{Lease: 30 * time.Second, Observer: obs})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	msgs := batchOf(n)
	var effects atomic.Int32
	h := func(ctx context.Context, msg consumerx.Message) error {
		effects.Add(1)
		if msg.ID != msgs[n-1].ID {
			return nil
		}
		ran.Store(true)
		// Redis refuses writes from now on: the batch's completions.
		return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
	}
	ctx := context.Background()
	res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
	took := time.Since(time.Unix(0, refused.Load()))
	if refused.Load() == 0 {
		t.Fatalf("the completions were not refused: the test tests nothing; %+v", res[0])
	}
	<-back
	t.Logf("the batch done %s after the first refusal", took.Round(time.Millisecond))
	processed, firstBad := 0, -1
	for i, r := range res {
		if r.Outcome == consumerx.Processed && r.Err == nil {
			processed++
		} else if firstBad < 0 {
			firstBad = i
		}
	}
	if processed != n || took >= consumerx.CompleteRetry {
		t.Errorf("%d of %d processed, the batch done %s after the first refusal; want all within the budget (%s)",
			processed, n, took.Round(time.Millisecond), consumerx.CompleteRetry)
	}
	if firstBad >= 0 {
		t.Errorf("first not processed: message %d: %s, %v", firstBad, res[firstBad].Outcome, res[firstBad].Err)
	}
	pending := 0
	for _, msg := range msgs {
		if rec, err := g.Get(ctx, guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msg.ID}); err != nil || rec.State != guard.StateCompleted {
			pending++
		}
	}
	if pending > 0 {
		t.Errorf("%d of %d records not completed: their effects would run again after the lease", pending, n)
	}
	if effects.Load() != n {
		t.Errorf("%d effects, want %d", effects.Load(), n)
	}
}

// perKeyStore hides the batch methods of the store it wraps: a store
// without a guard.BatchStore of its own.
type perKeyStore struct{ guard.Store }

// maxRetryRounds bounds the rounds of tries again within CompleteRetry at
// the pauses between them (20ms doubling up to 500ms: 20+40+80+160+320+500+500
// is 1620ms, so at most 8 rounds fit in the 2s budget), and the one past it.
const maxRetryRounds = 9

// The completions of a batch the store refused are tried again as one
// batch write per round when the store has batches (guard.BatchStore):
// 100 refused completions take a round trip per round, not one per
// message. Here a batch of 100 succeeds, the store refuses every
// completion and is back a quarter of the budget later: every message is
// Processed and recorded in at most maxRetryRounds round trips. (Each was
// completed on its own: the first one try per round until the store was
// back, then the other 99 one round trip each, 105 in all.) A store
// without batches still gets them one at a time, and records them all.
func TestBatchCompletionRetriesOneWritePerRound(t *testing.T) {
	const n = 100
	for _, batches := range []bool{true, false} {
		t.Run(fmt.Sprintf("batches=%v", batches), func(t *testing.T) {
			srv := testenv.StartRedis(t)
			rdb, admin := srv.Client(), srv.Client()
			trips := testenv.CountTrips(rdb)
			var (
				ran     atomic.Bool  // the batch's last handler has run
				refused atomic.Bool  // the store refused a completion
				before  atomic.Int64 // the trips when it did
			)
			back := make(chan struct{})
			obs := guard.ObserverFunc(func(ctx context.Context, e guard.Event) {
				if e.Kind == guard.EventUnavailable && ran.Load() && refused.CompareAndSwap(false, true) {
					before.Store(trips.Load())
					tm := time.AfterFunc(consumerx.CompleteRetry/4, func() {
						defer close(back)
						if err := admin.ConfigSet(context.Background(), "min-replicas-to-write", "0").Err(); err != nil {
							t.Error(err)
						}
					})
					t.Cleanup(func() { tm.Stop() })
				}
			})
			var s guard.Store = guardenv.StoreOn(t, rdb, guard.RedisOptions{})
			if !batches {
				s = perKeyStore{s}
			}
			// Leases outlive the whole batch and its retries on a loaded machine.
			g := guard.New(s, guard.Options{Lease: 30 * time.Second, Observer: obs})
			p := newProcessor(t, g, "billing", consumerx.Options{})
			msgs := batchOf(n)
			h := func(ctx context.Context, msg consumerx.Message) error {
				if msg.ID != msgs[n-1].ID {
					return nil
				}
				ran.Store(true)
				// Redis refuses writes from now on: the batch's completions.
				return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
			}
			ctx := context.Background()
			res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
			retries := trips.Load() - before.Load()
			if !refused.Load() {
				t.Fatalf("the completions were not refused: the test tests nothing; %+v", res[0])
			}
			<-back
			t.Logf("%d round trips to retry %d refused completions", retries, n)
			for i, r := range res {
				if r.Outcome != consumerx.Processed || r.Err != nil {
					t.Fatalf("message %d: %s, %v; want processed", i, r.Outcome, r.Err)
				}
			}
			for _, msg := range msgs {
				if rec, err := g.Get(ctx, guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msg.ID}); err != nil || rec.State != guard.StateCompleted {
					t.Fatalf("%s: record %+v, %v; want completed", msg.ID, rec, err)
				}
			}
			if batches && retries > maxRetryRounds {
				t.Errorf("%d round trips to retry %d completions; want one per round, at most %d", retries, n, maxRetryRounds)
			}
		})
	}
}

// splitStore is a Redis store (with batches) whose WriteBatch, called
// with less than lateWindow of its caller's deadline left, lifts the
// refusal of writes, makes the first half of the writes, answers the rest
// as refused (a store that failed half-way through the batch) and
// returns only past that deadline: the store back at the very end of the
// time a batch's completions are tried again for.
type splitStore struct {
	*guard.RedisStore
	admin *redis.Client
	split atomic.Bool
}

func (s *splitStore) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	dl, ok := ctx.Deadline()
	if !ok || time.Until(dl) >= lateWindow || s.split.Swap(true) {
		return s.RedisStore.WriteBatch(ctx, ws)
	}
	if err := s.admin.ConfigSet(context.WithoutCancel(ctx), "min-replicas-to-write", "0").Err(); err != nil {
		errs := make([]error, len(ws))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	half := len(ws) / 2
	errs := append(s.RedisStore.WriteBatch(context.WithoutCancel(ctx), ws[:half]), make([]error, len(ws)-half)...)
	for i := half; i < len(ws); i++ {
		errs[i] = fmt.Errorf("%w: connection reset mid-batch", guard.ErrUnavailable)
	}
	<-ctx.Done()
	return errs
}

// A batch's completions tried again in one write per round: when the
// round at the end of the budget is taken in part (the store is back but
// failed half-way through the batch), the rest get one more round past
// the budget, as a message of a batch tried one at a time does: the store
// is back, and without it they would be left pending, their effects run
// again after the lease.
func TestBatchCompletionRetryTakenInPartGetsOneMoreRound(t *testing.T) {
	const n = 10
	srv := testenv.StartRedis(t)
	admin := srv.Client()
	s := &splitStore{RedisStore: guardenv.StoreOn(t, srv.Client(), guard.RedisOptions{}), admin: admin}
	g := guard.New(s, guard.Options{Lease: 30 * time.Second})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	msgs := batchOf(n)
	h := func(ctx context.Context, msg consumerx.Message) error {
		if msg.ID != msgs[n-1].ID {
			return nil
		}
		// Redis refuses writes from now on: the batch's completions.
		return admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
	}
	ctx := context.Background()
	res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
	if !s.split.Load() {
		t.Fatalf("no round was taken in part at the end of the budget: the test tests nothing; %+v", res[0])
	}
	for i, r := range res {
		if r.Outcome != consumerx.Processed || r.Err != nil {
			t.Errorf("message %d: %s, %v; want processed", i, r.Outcome, r.Err)
		}
	}
	for _, msg := range msgs {
		if rec, err := g.Get(ctx, guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msg.ID}); err != nil || rec.State != guard.StateCompleted {
			t.Errorf("%s: record %+v, %v; want completed", msg.ID, rec, err)
		}
	}
}
