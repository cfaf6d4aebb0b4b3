package consumerx_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
)

func batchOf(n int) []consumerx.Message {
	msgs := make([]consumerx.Message, n)
	for i := range msgs {
		msgs[i] = consumerx.Message{ID: fmt.Sprint("m", i), Payload: fmt.Appendf(nil, "charge %d", i)}
	}
	return msgs
}

// One batch: a handler fails, one panics, one's lease is taken over by
// another consumer while it runs, one runs for three leases; the others
// succeed. Every other message is processed exactly once; the failed one
// is failed (attempt counted) and runs again on its next delivery, and so
// is the panicked one (a panic is a failed attempt); the one whose lease was
// lost is left to its new holder. Each handler sees its own lease.
func TestProcessBatchEachMessageOnItsOwn(t *testing.T) {
	// Extended every 333ms: a lease of 300ms (extended every 100ms) ran
	// out on a loaded machine, one extension late, and cut m6 short.
	const lease = time.Second
	g, rdb, _ := consumertest.Guard(t, guard.Options{Lease: lease})
	s := g.Store().(*guard.RedisStore)
	other := guard.New(s, guard.Options{Lease: time.Minute})
	var outs consumertest.Outcomes
	p := newProcessor(t, g, "billing", consumerx.Options{OnOutcome: outs.Hook})
	msgs := batchOf(8)
	const fails, panics, stolen, long = 1, 3, 5, 6
	effects := make([]atomic.Int32, len(msgs))
	var fences sync.Map
	first := true
	h := func(ctx context.Context, msg consumerx.Message) error {
		var i int
		fmt.Sscanf(msg.ID, "m%d", &i)
		l, ok := consumerx.LeaseFrom(ctx)
		if !ok || l.Key.ID != msg.ID {
			t.Errorf("%s runs under %+v", msg.ID, l)
		}
		fences.Store(msg.ID, l.Fence)
		if first {
			switch i {
			case fails:
				return errors.New("gateway timeout")
			case panics:
				panic("nil map")
			case stolen:
				// Another consumer takes the message over, as after this
				// holder's lease ran out.
				if err := rdb.Del(ctx, s.Name(l.Key)).Err(); err != nil {
					t.Error(err)
				}
				sum := sha256.Sum256(msg.Payload) // the default fingerprint
				if _, err := other.Claim(context.Background(), l.Key, base64.RawURLEncoding.EncodeToString(sum[:])); err != nil {
					t.Error(err)
				}
				<-ctx.Done()
				if !errors.Is(context.Cause(ctx), guard.ErrLeaseLost) {
					t.Errorf("stolen message's context ended with %v", context.Cause(ctx))
				}
				return ctx.Err()
			case long:
				select {
				case <-ctx.Done():
					return fmt.Errorf("cut short: %w", context.Cause(ctx))
				case <-time.After(3 * lease):
				}
			}
		}
		effects[i].Add(1)
		return nil
	}
	ctx := context.Background()
	res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Concurrency: 4})
	want := map[int]consumerx.Outcome{fails: consumerx.Failed, panics: consumerx.Failed, stolen: consumerx.Failed}
	for i, r := range res {
		w := want[i]
		if w == 0 {
			w = consumerx.Processed
		}
		if r.Outcome != w {
			t.Errorf("%s: %s, %v; want %s", msgs[i].ID, r.Outcome, r.Err, w)
		}
	}
	var pe *guard.PanicError
	if !errors.Is(res[panics].Err, guard.ErrPanicked) || !errors.As(res[panics].Err, &pe) || pe.Value != "nil map" || len(pe.Stack) == 0 {
		t.Errorf("panicked message's error = %v, want ErrPanicked with the value and stack", res[panics].Err)
	}
	if all := outs.All(); all[consumerx.Processed] != 5 || all[consumerx.Failed] != 3 {
		t.Errorf("OnOutcome heard %v", all)
	}
	key := func(i int) guard.Key { k, _ := p.Key(msgs[i]); return k }
	if rec, err := g.Get(ctx, key(fails)); err != nil || rec.State != guard.StateFailed || rec.Attempt != 1 {
		t.Errorf("failed message's record: %+v, %v", rec, err)
	}
	if rec, err := g.Get(ctx, key(panics)); err != nil || rec.State != guard.StateFailed || rec.Attempt != 1 {
		t.Errorf("panicked message's record: %+v, %v; want failed, attempt 1", rec, err)
	}
	if rec, err := g.Get(ctx, key(stolen)); err != nil || rec.State != guard.StatePending || rec.Fence != 1 || rec.Attempt != 1 {
		t.Errorf("stolen message's record: %+v, %v; want the other holder's", rec, err)
	}

	// The next delivery of the whole batch: the failed message runs again
	// (attempt 2), the panicked one too, the others are
	// duplicates, the stolen one is in progress elsewhere.
	first = false
	res = p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{})
	for i, r := range res {
		w := consumerx.Duplicate
		switch i {
		case fails, panics:
			w = consumerx.Processed
		case stolen:
			w = consumerx.InProgress
		}
		if r.Outcome != w {
			t.Errorf("redelivery of %s: %s, %v; want %s", msgs[i].ID, r.Outcome, r.Err, w)
		}
	}
	if f, _ := fences.Load(msgs[fails].ID); f != int64(2) {
		t.Errorf("failed message reran at fence %v, want 2", f)
	}
	if f, _ := fences.Load(msgs[panics].ID); f != int64(2) {
		t.Errorf("panicked message reran at fence %v, want 2", f)
	}
	for i := range msgs {
		if n, want := effects[i].Load(), map[bool]int32{true: 0, false: 1}[i == stolen]; n != want {
			t.Errorf("%s: %d effects, want %d", msgs[i].ID, n, want)
		}
	}
}

// A consumer stopped in the middle of a batch: the running handler that
// then fails is Interrupted and released, the messages whose turn had not
// come are Interrupted without running; nothing is dead-lettered and no
// attempt counted, even at the attempt limit.
func TestProcessBatchShutdown(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead atomic.Int32
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 1,
		DeadLetter: func(context.Context, consumerx.Message, error) error { dead.Add(1); return nil }})
	msgs := batchOf(4)
	ctx, cancel := context.WithCancel(context.Background())
	var ran []string
	res := p.ProcessBatch(ctx, msgs, func(ctx context.Context, msg consumerx.Message) error {
		ran = append(ran, msg.ID)
		if msg.ID == "m1" {
			cancel() // shutdown
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}, consumerx.BatchOptions{})
	if fmt.Sprint(ran) != "[m0 m1]" || res[0].Outcome != consumerx.Processed {
		t.Fatalf("ran %v, results %+v", ran, res)
	}
	for i := 1; i < 4; i++ {
		if res[i].Outcome != consumerx.Interrupted || !errors.Is(res[i].Err, context.Canceled) {
			t.Errorf("%s: %s, %v; want interrupted", msgs[i].ID, res[i].Outcome, res[i].Err)
		}
		k, _ := p.Key(msgs[i])
		if _, err := g.Get(context.Background(), k); !errors.Is(err, guard.ErrNotFound) {
			t.Errorf("%s: record %v, want released", msgs[i].ID, err)
		}
	}
	// Stopped before the batch: nothing runs, everything is interrupted.
	res = p.ProcessBatch(ctx, msgs[1:], func(context.Context, consumerx.Message) error {
		t.Error("a handler ran after shutdown")
		return nil
	}, consumerx.BatchOptions{})
	for i, r := range res {
		if r.Outcome != consumerx.Interrupted {
			t.Errorf("after shutdown, %s: %s, %v", msgs[i+1].ID, r.Outcome, r.Err)
		}
	}
	if dead.Load() != 0 {
		t.Errorf("%d dead letters", dead.Load())
	}
}

// An ordered batch stops at the first message not acknowledged: later
// messages are Skipped (released, not run). A message dead-lettered is
// acknowledged but stops the batch too: the consumer goes on from the
// first message not acknowledged.
func TestProcessBatchOrdered(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead []string
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: 2,
		DeadLetter: func(_ context.Context, msg consumerx.Message, _ error) error { dead = append(dead, msg.ID); return nil }})
	msgs := batchOf(5)
	var ran []string
	h := func(_ context.Context, msg consumerx.Message) error {
		ran = append(ran, msg.ID)
		if msg.ID == "m2" {
			return errors.New("declined")
		}
		return nil
	}
	ctx := context.Background()
	want := func(round int, res []consumerx.BatchResult, outs ...consumerx.Outcome) {
		t.Helper()
		for i, r := range res {
			if r.Outcome != outs[i] {
				t.Errorf("round %d, %s: %s, %v; want %s", round, msgs[i].ID, r.Outcome, r.Err, outs[i])
			}
		}
	}
	P, D, F, S, L := consumerx.Processed, consumerx.Duplicate, consumerx.Failed, consumerx.Skipped, consumerx.DeadLettered
	want(1, p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Ordered: true, Concurrency: 4}), P, P, F, S, S)
	want(2, p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Ordered: true}), D, D, L, S, S)
	want(3, p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Ordered: true}), D, D, L, S, S)
	want(4, p.ProcessBatch(ctx, msgs[3:], h, consumerx.BatchOptions{Ordered: true}), P, P)
	if fmt.Sprint(ran) != "[m0 m1 m2 m2 m3 m4]" || fmt.Sprint(dead) != "[m2]" {
		t.Errorf("ran %v, dead-lettered %v", ran, dead)
	}
	for _, i := range []int{3, 4} {
		if rec, err := g.Get(ctx, guard.Key{Scope: consumerx.ScopePrefix + "billing", ID: msgs[i].ID}); err != nil || rec.Attempt != 1 {
			t.Errorf("%s: %+v, %v; want one attempt (the skips were released)", msgs[i].ID, rec, err)
		}
	}
}

// A message whose handler returned keeps its claim while the rest of its
// batch runs, however long that takes: MaxRun bounds a handler's run, not
// the wait for the batch's writes. (The heartbeat used to drop the lease of
// a handler that had returned once MaxRun had passed since it started: the
// lease ran out while the batch still ran, and another consumer took the
// message over and ran its effect a second time.)
//
// The heartbeat extends the batch's leases every third of a lease: a
// machine that holds the process back for two thirds of one (seen at load
// 20-37 with 800 ms) loses a lease, rightly, and that looks like the
// defect. The store's record of the extensions tells them apart: a lease
// lost while the heartbeat sent no extension from when its next was due
// to the lease's deadline, or whose extension was answered after that
// deadline or not at all, proves nothing, and the case runs again with a
// lease twice as long (testenv.OnTime); one lost while the heartbeat
// extended the batch's other leases on time, or never lost, fails at once.
func TestProcessBatchFinishedMessageKeptPastMaxRun(t *testing.T) {
	testenv.OnTime(t, "a lease", 800*time.Millisecond, 3, func(lease time.Duration) bool {
		return finishedMessageKeptPastMaxRun(t, lease)
	})
}

// finishedMessageKeptPastMaxRun runs the case with lease; late reports a
// lease of the batch lost by a late heartbeat or a late answer.
func finishedMessageKeptPastMaxRun(t *testing.T, lease time.Duration) (late bool) {
	maxRun := 4 * lease
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	consumertest.DeleteKeysAtEnd(t, rdb, prefix)
	store := &extendLog{RedisStore: guardenv.StoreOn(t, rdb, guard.RedisOptions{Prefix: prefix})}
	g := guard.New(store, guard.Options{Lease: lease, MaxRun: maxRun})
	p := newProcessor(t, g, "billing", consumerx.Options{})
	other := newProcessor(t, g, "billing", consumerx.Options{}) // another consumer of the group
	msgs := batchOf(3)
	var effects [3]atomic.Int32
	var deadlines [3]time.Time  // each lease's first deadline
	var again consumerx.Outcome // the other consumer's last answer for m0
	h := func(ctx context.Context, msg consumerx.Message) error {
		var i int
		fmt.Sscanf(msg.ID, "m%d", &i)
		l, _ := consumerx.LeaseFrom(ctx)
		deadlines[i] = l.Deadline
		switch i {
		case 1:
			// Longer than a lease, well short of MaxRun.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * lease / 2):
			}
		case 2:
			// Runs until its own MaxRun ends it, which is past m0's
			// MaxRun and a lease more: meanwhile m0 is delivered to
			// another consumer again and again.
			tick := time.NewTicker(lease / 10)
			defer tick.Stop()
			for effects[0].Load() < 2 {
				again, _ = other.Process(context.Background(), msgs[0], func(context.Context, consumerx.Message) error {
					effects[0].Add(1)
					return nil
				})
				select {
				case <-ctx.Done():
					effects[i].Add(1)
					return nil
				case <-tick.C:
				}
			}
			return errors.New("m0 ran again")
		}
		effects[i].Add(1)
		return nil
	}
	res := p.ProcessBatch(context.Background(), msgs, h, consumerx.BatchOptions{})
	ended := time.Now()
	// lost tells whether the lease of msgs[i] was lost by a late heartbeat
	// or a late answer, and logs what the record says.
	lost := func(i int) bool {
		first := deadlines[i]
		if first.IsZero() { // its handler never ran: the batch's leases share their first deadline
			first = deadlines[0]
		}
		late, why := store.verdict(msgs[i].ID, first, lease, ended)
		t.Logf("%s: %s", msgs[i].ID, why)
		return late
	}
	if n := effects[0].Load(); n != 1 {
		if lost(0) {
			return true
		}
		t.Fatalf("m0's effect ran %d times (the other consumer's last delivery: %s); batch: %+v", n, again, res)
	}
	for i := range 2 {
		if res[i].Outcome != consumerx.Processed {
			if lost(i) {
				return true
			}
			t.Errorf("%s: %s, %v; want processed", msgs[i].ID, res[i].Outcome, res[i].Err)
		}
	}
	if again != consumerx.InProgress {
		if lost(2) {
			return true
		}
		t.Errorf("the other consumer's delivery of m0 during the batch: %s, want in_progress", again)
	}
	if o, err := other.Process(context.Background(), msgs[0], func(context.Context, consumerx.Message) error {
		t.Error("m0 ran again after the batch")
		return nil
	}); o != consumerx.Duplicate {
		t.Errorf("m0 after the batch: %s, %v; want duplicate", o, err)
	}
	return false
}

// extendLog is a Redis store (with batches) that records the lease
// extensions a batch's heartbeat sends (guard.WriteExtend): when each
// write was sent and answered, and each key's answer.
type extendLog struct {
	*guard.RedisStore
	mu     sync.Mutex
	writes []extendWrite
}

type extendWrite struct {
	sent, answered time.Time
	errs           map[string]error // by key id
}

func (s *extendLog) WriteBatch(ctx context.Context, ws []guard.Write) []error {
	sent := time.Now()
	errs := s.RedisStore.WriteBatch(ctx, ws)
	w := extendWrite{sent: sent, answered: time.Now(), errs: map[string]error{}}
	for i, x := range ws {
		if x.Kind == guard.WriteExtend {
			w.errs[x.Lease.Key.ID] = errs[i]
		}
	}
	if len(w.errs) > 0 {
		s.mu.Lock()
		s.writes = append(s.writes, w)
		s.mu.Unlock()
	}
	return errs
}

// verdict says whether the lease of key id, first due at first, was lost
// late by the record: its deadline in force (when the claim or the last
// extension that succeeded in time was sent, plus the lease less its
// margin) passed before ended, the batch's end, while the heartbeat sent
// no extension of any key from when the next was due (a third of the
// lease on) to that deadline, or its extension was sent in time but
// answered after the deadline, or not at all (unavailable, timed out).
// An extension sent in time without it, or refused otherwise, is not
// late: the heartbeat dropped the lease. why tells what the record says.
func (s *extendLog) verdict(id string, first time.Time, lease time.Duration, ended time.Time) (late bool, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	validity := lease - guard.LeaseMargin(lease)
	if first.IsZero() {
		return false, "its handler never ran: no deadline known"
	}
	from, deadline := first.Add(-validity), first // the claim's, then each extension's
	at := func(t time.Time) string { return t.Sub(first.Add(-validity)).Round(time.Millisecond).String() }
	var unanswered error // an extension not answered (unavailable, timed out) before the deadline
	for _, w := range s.writes {
		if !w.sent.Before(deadline) {
			break
		}
		err, ok := w.errs[id]
		switch {
		case !ok:
		case !w.answered.Before(deadline):
			return true, fmt.Sprintf("its extension sent at %s was answered at %s, past its deadline %s (%v): a late answer",
				at(w.sent), at(w.answered), at(deadline), err)
		case err == nil:
			from, deadline, unanswered = w.sent, w.sent.Add(validity), nil
		case errors.Is(err, guard.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
			unanswered = err // tried again soon, while the lease lasts
		default:
			return false, fmt.Sprintf("its extension sent at %s, before its deadline %s, was refused: %v", at(w.sent), at(deadline), err)
		}
	}
	if !deadline.Before(ended) {
		return false, fmt.Sprintf("extended on time until the batch ended at %s (deadline %s)", at(ended), at(deadline))
	}
	if unanswered != nil {
		return true, fmt.Sprintf("its extensions after %s went unanswered until its deadline %s (%v): a late answer", at(from), at(deadline), unanswered)
	}
	due := from.Add(lease / 3)
	for _, w := range s.writes {
		if !w.sent.Before(due) && w.sent.Before(deadline) {
			return false, fmt.Sprintf("the heartbeat extended other leases at %s, between its extension's due time %s and its deadline %s, but not it",
				at(w.sent), at(due), at(deadline))
		}
	}
	return true, fmt.Sprintf("the heartbeat sent no extension from its extension's due time %s to its deadline %s (the claim sent at 0s): a late heartbeat",
		at(due), at(deadline))
}

// In an ordered batch, a message without a usable id keeps its place: it
// is dead-lettered only once every message before it is acknowledged, and
// the batch stops there, as it stops at any other dead letter. (It used to
// be dead-lettered before the batch ran, whatever became of the messages
// before it: a Kafka partition retrying a failing record before it
// produced the bad record to the dead-letter topic once per retry.)
func TestProcessBatchOrderedBadKeyKeepsItsPlace(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var dead []string
	p := newProcessor(t, g, "billing", consumerx.Options{
		Key: func(msg consumerx.Message) (string, error) {
			if msg.ID == "m2" {
				return "", errors.New("no order id in the payload")
			}
			return msg.ID, nil
		},
		DeadLetter: func(_ context.Context, msg consumerx.Message, _ error) error { dead = append(dead, msg.ID); return nil }})
	msgs := batchOf(4)
	var ran []string
	fail := true
	h := func(_ context.Context, msg consumerx.Message) error {
		ran = append(ran, msg.ID)
		if msg.ID == "m1" && fail {
			return errors.New("declined")
		}
		return nil
	}
	ctx := context.Background()
	P, D, F, S, L := consumerx.Processed, consumerx.Duplicate, consumerx.Failed, consumerx.Skipped, consumerx.DeadLettered
	want := func(round int, res []consumerx.BatchResult, outs ...consumerx.Outcome) {
		t.Helper()
		for i, r := range res {
			if r.Outcome != outs[i] {
				t.Errorf("round %d, %s: %s, %v; want %s", round, msgs[len(msgs)-len(res)+i].ID, r.Outcome, r.Err, outs[i])
			}
		}
	}
	// The partition is retried from m1 until it succeeds.
	want(1, p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Ordered: true}), P, F, S, S)
	want(2, p.ProcessBatch(ctx, msgs[1:], h, consumerx.BatchOptions{Ordered: true}), F, S, S)
	if len(dead) != 0 {
		t.Errorf("dead-lettered %v while the message before it was not acknowledged", dead)
	}
	fail = false
	res := p.ProcessBatch(ctx, msgs[1:], h, consumerx.BatchOptions{Ordered: true})
	want(3, res, P, L, S)
	if !errors.Is(res[1].Err, consumerx.ErrNoKey) || !errors.Is(res[2].Err, guard.ErrSkipped) {
		t.Errorf("round 3 errors: %v, %v", res[1].Err, res[2].Err)
	}
	want(4, p.ProcessBatch(ctx, msgs[3:], h, consumerx.BatchOptions{Ordered: true}), P)
	// A redelivery finds m2's dead letter done: it is not sent again.
	want(5, p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Ordered: true}), D, D, L, S)
	if fmt.Sprint(ran) != "[m0 m1 m1 m1 m3]" || fmt.Sprint(dead) != "[m2]" {
		t.Errorf("ran %v, dead-lettered %v", ran, dead)
	}
}

// A message whose handler always panics is not redelivered for ever: each
// panic is a failed attempt (Failed, ErrPanicked), and the delivery of
// the last one dead-letters it once, with a cause matching ErrExhausted
// and holding the panic. A handler that panics once the consumer's
// context has ended is Interrupted, its claim released, as one returning
// an error then is.
func TestProcessBatchPanicIsFailedAttempt(t *testing.T) {
	const maxAttempts = 3
	g, _, _ := consumertest.Guard(t, guard.Options{})
	var causes []error
	p := newProcessor(t, g, "billing", consumerx.Options{MaxAttempts: maxAttempts,
		DeadLetter: func(_ context.Context, _ consumerx.Message, c error) error { causes = append(causes, c); return nil }})
	msgs := batchOf(2)
	var runs int
	h := func(_ context.Context, msg consumerx.Message) error {
		if msg.ID == "m0" {
			runs++
			panic("nil map")
		}
		return nil
	}
	ctx := context.Background()
	for round := 1; round <= maxAttempts+1; round++ {
		res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Concurrency: 2})
		want, wantErr := consumerx.Failed, guard.ErrPanicked
		switch {
		case round == maxAttempts:
			want = consumerx.DeadLettered
		case round > maxAttempts: // the record says why: the handler did not run
			want, wantErr = consumerx.DeadLettered, guard.ErrExhausted
		}
		if res[0].Outcome != want || !errors.Is(res[0].Err, wantErr) || res[1].Outcome.Ack() != true {
			t.Errorf("round %d: %s, %v (m1 %s); want %s, %v", round, res[0].Outcome, res[0].Err, res[1].Outcome, want, wantErr)
		}
	}
	var pe *guard.PanicError
	if runs != maxAttempts || len(causes) != 1 || !errors.Is(causes[0], guard.ErrExhausted) ||
		!errors.As(causes[0], &pe) || pe.Value != "nil map" {
		t.Errorf("ran %d times, dead letters %v; want %d runs, one dead letter, exhausted by the panic", runs, causes, maxAttempts)
	}

	// Panicking after the consumer's context ended: Interrupted, released.
	stopped, stop := context.WithCancel(ctx)
	one := []consumerx.Message{{ID: "late", Payload: []byte("x")}}
	res := p.ProcessBatch(stopped, one, func(context.Context, consumerx.Message) error { stop(); panic("late") }, consumerx.BatchOptions{})
	key, _ := p.Key(one[0])
	if _, err := g.Get(ctx, key); res[0].Outcome != consumerx.Interrupted || !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("panic after shutdown: %s, %v, record %v; want interrupted, released", res[0].Outcome, res[0].Err, err)
	}
}
