package storetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
)

// batch runs the batch cases: the BatchStore calls (when the store has
// them) against the answers of the per-key calls, and Guard.DoBatch on
// every store (through its per-key calls when it has no batches).
func (c contract) batch(t *testing.T) {
	c.run(t, []testCase{
		{"ClaimBatchAnswersAsClaim", c.claimBatch},
		{"WriteBatchAnswersAsWrites", c.writeBatch},
		{"WriteBatchAfterTakeover", c.writeBatchAfterTakeover},
		{"BatchBadDurations", c.batchBadDurations},
		{"DoBatchRunsOnceThenReplays", c.doBatchOnce},
		{"DoBatchMixedStates", c.doBatchMixed},
		{"DoBatchEachKeyOnItsOwn", c.doBatchEach},
	})
	t.Run("DoBatchRace", c.doBatchRace)
}

// batchStore returns s as a BatchStore, or skips the test.
func batchStore(t *testing.T, s guard.Store) guard.BatchStore {
	t.Helper()
	bs, ok := s.(guard.BatchStore)
	if !ok {
		t.Skip("the store has no batch calls (Guard.DoBatch makes its per-key calls: see the DoBatch cases)")
	}
	return bs
}

// mixedKeys puts keys in every state a claim can meet and returns the
// requests of a batch over them, with the status each must get; the
// recovered key's lease has run out (h.Advance). The keys that must still
// be held when the batch comes are claimed for heldLease, not h.Lease: on
// a loaded machine the setup's other calls may take longer than h.Lease.
func (c contract) mixedKeys(t *testing.T, s guard.Store) ([]guard.ClaimRequest, []guard.Status) {
	t.Helper()
	var reqs []guard.ClaimRequest
	var want []guard.Status
	add := func(r guard.ClaimRequest, st guard.Status) {
		reqs = append(reqs, r)
		want = append(want, st)
	}
	expired := newKey(t)
	acquire(t, s, c.req(expired, "old"))
	c.h.Advance(t, c.h.Lease) // its holder died

	fresh, held, done, other, failed, exhausted, mine := newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t)
	long := func(r guard.ClaimRequest) guard.ClaimRequest { r.Lease = heldLease; return r }
	acquire(t, s, long(c.req(held, "H")))
	acquire(t, s, c.req(done, "D"))
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: done, Token: "D"}, []byte("done"), time.Hour))
	acquire(t, s, c.req(other, "O"))
	mustOK(t, "complete", s.Complete(ctx, guard.Lease{Key: other, Token: "O"}, []byte("secret"), time.Hour))
	acquire(t, s, c.req(failed, "F"))
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: failed, Token: "F"}, "boom", time.Hour))
	acquire(t, s, c.req(exhausted, "E"))
	mustOK(t, "fail", s.Fail(ctx, guard.Lease{Key: exhausted, Token: "E"}, "last", time.Hour))
	acquire(t, s, long(c.req(mine, "M")))

	add(c.req(fresh, "B1"), guard.Acquired)
	add(c.req(held, "B2"), guard.InProgress)
	add(c.req(done, "B3"), guard.Replay)
	mm := c.req(other, "B4")
	mm.Fingerprint = "another payload"
	add(mm, guard.Mismatch)
	add(c.req(failed, "B5"), guard.Acquired)
	ex := c.req(exhausted, "B6")
	ex.MaxAttempts = 1
	add(ex, guard.Exhausted)
	add(long(c.req(mine, "M")), guard.Acquired) // this claim sent again
	add(c.req(expired, "B8"), guard.Acquired)
	return reqs, want
}

// heldLease is the lease of mixedKeys's keys that must still be held.
const heldLease = time.Minute

// claimBatch: every answer of ClaimBatch is Claim's for that key, and the
// same batch sent again (a client's retry) gets the same answers.
func (c contract) claimBatch(t *testing.T) {
	s := c.h.New(t)
	bs := batchStore(t, s)
	reqs, want := c.mixedKeys(t, s)
	out, errs := bs.ClaimBatch(ctx, reqs)
	if len(out) != len(reqs) || len(errs) != len(reqs) {
		t.Fatalf("ClaimBatch of %d gave %d outcomes, %d errors", len(reqs), len(out), len(errs))
	}
	for i, r := range reqs {
		if errs[i] != nil || out[i].Status != want[i] {
			t.Errorf("%s by %s: %v, %v; want %v", r.Key, r.Token, out[i].Status, errs[i], want[i])
		}
	}
	check := func(i int, what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("%s: %s: %+v", reqs[i].Key, what, out[i])
		}
	}
	check(0, "first attempt", out[0].Lease.Fence == 1 && out[0].Lease.Attempt == 1 && !out[0].Lease.Recovered &&
		out[0].Lease.Key == reqs[0].Key && out[0].Lease.Token == reqs[0].Token)
	check(1, "lease left", out[1].LeaseLeft > 0 && out[1].LeaseLeft <= heldLease)
	check(2, "replayed result", string(out[2].Result) == "done")
	check(3, "nothing revealed", out[3].Result == nil)
	check(4, "second attempt", out[4].Lease.Fence == 2 && out[4].Lease.Attempt == 2 && !out[4].Lease.Recovered)
	check(5, "attempts and last error", out[5].Attempts == 1 && out[5].LastError == "last")
	check(6, "the same lease", out[6].Lease.Fence == 1 && out[6].Lease.Token == "M")
	check(7, "recovered", out[7].Lease.Fence == 2 && out[7].Lease.Attempt == 2 && out[7].Lease.Recovered)

	again, errs2 := bs.ClaimBatch(ctx, reqs)
	for i := range reqs {
		if errs2[i] != nil || again[i].Status != out[i].Status || again[i].Lease != out[i].Lease || string(again[i].Result) != string(out[i].Result) {
			t.Errorf("%s sent again: %+v, %v; want %+v", reqs[i].Key, again[i], errs2[i], out[i])
		}
	}
	// The holders' writes work with the batch's leases.
	mustOK(t, "complete the fresh key", s.Complete(ctx, out[0].Lease, []byte("r"), time.Hour))
	if rec := get(t, s, reqs[0].Key); rec.State != guard.StateCompleted || string(rec.Result) != "r" {
		t.Errorf("record after completion = %+v", rec)
	}
}

// writeBatch: every answer of WriteBatch is the per-key write's, the same
// batch again gets the same answers, and each record ends as the
// per-key writes leave it.
func (c contract) writeBatch(t *testing.T) {
	s := c.h.New(t)
	bs := batchStore(t, s)
	lease := func(tok string) guard.Lease {
		k := newKey(t)
		return acquire(t, s, c.req(k, tok))
	}
	completed, failed, released, extended := lease("A"), lease("B"), lease("C"), lease("D")
	stale := lease("E")
	gone := guard.Lease{Key: newKey(t), Token: "Z"}
	byHand := lease("F")
	byHand = guard.Lease{Key: byHand.Key, Token: byHand.Token} // a hand-built lease works too
	ws := []guard.Write{
		{Kind: guard.WriteComplete, Lease: completed, Result: []byte("result\x00\xff"), TTL: time.Hour},
		{Kind: guard.WriteFail, Lease: failed, Reason: "declined", TTL: time.Hour},
		{Kind: guard.WriteRelease, Lease: released},
		{Kind: guard.WriteExtend, Lease: extended, TTL: time.Hour},
		{Kind: guard.WriteComplete, Lease: guard.Lease{Key: stale.Key, Token: "X"}, Result: []byte("x"), TTL: time.Hour},
		{Kind: guard.WriteExtend, Lease: gone, TTL: time.Hour},
		{Kind: guard.WriteRelease, Lease: gone},
		{Kind: guard.WriteComplete, Lease: byHand, Result: nil, TTL: time.Hour},
	}
	lost := map[int]bool{4: true, 5: true}
	for round := range 2 {
		errs := bs.WriteBatch(ctx, ws)
		if len(errs) != len(ws) {
			t.Fatalf("WriteBatch of %d gave %d errors", len(ws), len(errs))
		}
		for i, w := range ws {
			if lost[i] && !errors.Is(errs[i], guard.ErrLeaseLost) || !lost[i] && errs[i] != nil {
				t.Errorf("round %d: %s of %s by %s: %v (want lost: %t)", round, w.Kind, w.Lease.Key, w.Lease.Token, errs[i], lost[i])
			}
		}
	}
	if rec := get(t, s, completed.Key); rec.State != guard.StateCompleted || string(rec.Result) != "result\x00\xff" {
		t.Errorf("completed record = %+v", rec)
	}
	if rec := get(t, s, failed.Key); rec.State != guard.StateFailed || rec.LastError != "declined" {
		t.Errorf("failed record = %+v", rec)
	}
	if _, err := s.Get(ctx, released.Key); !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("released record: %v, want not found", err)
	}
	if rec := get(t, s, extended.Key); rec.State != guard.StatePending || rec.LeaseLeft <= c.h.Lease {
		t.Errorf("extended record = %+v, want pending with more than %s left", rec, c.h.Lease)
	}
	if rec := get(t, s, stale.Key); rec.State != guard.StatePending || rec.Token != "E" {
		t.Errorf("record written with a stale token = %+v", rec)
	}
	if _, err := s.Get(ctx, gone.Key); !errors.Is(err, guard.ErrNotFound) {
		t.Errorf("writes to an absent key created it: %v", err)
	}
	if rec := get(t, s, byHand.Key); rec.State != guard.StateCompleted || len(rec.Result) != 0 {
		t.Errorf("record completed through a hand-built lease = %+v", rec)
	}
}

// writeBatchAfterTakeover: the writes of a holder whose lease ran out and
// whose key another holder took over, sent as a batch with the lease its
// claim returned (whatever the store keeps in it of the record it wrote:
// the Redis store's batch completion compares the record with that), are
// each lost and change nothing of the new holder's record; the new
// holder's own batch completes it. (A batch completion that took any
// pending record for its holder's was caught only by the pipelined
// nemesis, on two seeds of five.)
func (c contract) writeBatchAfterTakeover(t *testing.T) {
	s := c.h.New(t)
	bs := batchStore(t, s)
	outs, errs := bs.ClaimBatch(ctx, []guard.ClaimRequest{c.req(newKey(t), "A"), c.req(newKey(t), "A")})
	var old []guard.Lease
	for i, out := range outs {
		if errs[i] != nil || out.Status != guard.Acquired {
			t.Fatalf("ClaimBatch: %v, %v", out.Status, errs[i])
		}
		old = append(old, out.Lease)
	}
	c.h.Advance(t, c.h.Lease)
	var taken []guard.Lease
	for _, l := range old {
		taken = append(taken, acquire(t, s, c.req(l.Key, "B")))
	}
	for _, ws := range [][]guard.Write{{
		{Kind: guard.WriteComplete, Lease: old[0], Result: []byte("A's"), TTL: time.Hour},
		{Kind: guard.WriteComplete, Lease: old[1], Result: []byte("A's"), TTL: time.Hour},
	}, {
		{Kind: guard.WriteFail, Lease: old[1], Reason: "A's", TTL: time.Hour},
		{Kind: guard.WriteExtend, Lease: old[0], TTL: time.Hour},
	}} {
		for i, err := range bs.WriteBatch(ctx, ws) {
			mustLost(t, fmt.Sprintf("the former holder's %s in a batch", ws[i].Kind), err)
		}
	}
	for _, l := range taken {
		if rec := get(t, s, l.Key); rec.State != guard.StatePending || rec.Token != "B" {
			t.Errorf("the new holder's record after the former holder's batch = %+v", rec)
		}
	}
	errs = bs.WriteBatch(ctx, []guard.Write{
		{Kind: guard.WriteComplete, Lease: taken[0], Result: []byte("B's"), TTL: time.Hour},
		{Kind: guard.WriteComplete, Lease: taken[1], Result: []byte("B's"), TTL: time.Hour},
	})
	for i, l := range taken {
		mustOK(t, "the new holder's completion in a batch", errs[i])
		if rec := get(t, s, l.Key); rec.State != guard.StateCompleted || string(rec.Result) != "B's" {
			t.Errorf("record after the new holder's batch = %+v", rec)
		}
	}
}

// batchBadDurations: in a batch, a claim or a write with a bad duration
// is refused as the per-key call refuses it (see BadDurations), changing
// nothing, and the others of the batch go on.
func (c contract) batchBadDurations(t *testing.T) {
	s := c.h.New(t)
	bs := batchStore(t, s)
	bad, good := newKey(t), newKey(t)
	zero := c.req(bad, "bad")
	zero.TTL = 0
	negative := c.req(newKey(t), "bad")
	negative.Lease = -time.Second
	reqs := []guard.ClaimRequest{zero, c.req(good, "A"), negative}
	out, errs := bs.ClaimBatch(ctx, reqs)
	mustRefuse(t, "batch claim with a zero TTL", errs[0])
	mustRefuse(t, "batch claim with a negative lease", errs[2])
	if errs[1] != nil || out[1].Status != guard.Acquired {
		t.Fatalf("the good claim of the batch: %+v, %v", out[1], errs[1])
	}
	for _, r := range []guard.ClaimRequest{zero, negative} {
		if _, err := s.Get(ctx, r.Key); !errors.Is(err, guard.ErrNotFound) {
			t.Fatalf("a refused batch claim left a record: %v", err)
		}
	}

	held := c.req(bad, "H")
	held.Lease = time.Minute
	l := acquire(t, s, held)
	ws := []guard.Write{
		{Kind: guard.WriteComplete, Lease: l, Result: []byte("x")},
		{Kind: guard.WriteFail, Lease: l, Reason: "x", TTL: -time.Second},
		{Kind: guard.WriteExtend, Lease: l},
		{Kind: guard.WriteComplete, Lease: out[1].Lease, Result: []byte("a"), TTL: time.Hour},
	}
	werrs := bs.WriteBatch(ctx, ws)
	for i := range 3 {
		mustRefuse(t, fmt.Sprintf("batch %s with ttl %s", ws[i].Kind, ws[i].TTL), werrs[i])
	}
	mustOK(t, "the good write of the batch", werrs[3])
	if rec := get(t, s, bad); rec.State != guard.StatePending || rec.Token != "H" || rec.LeaseLeft < held.Lease/2 {
		t.Fatalf("record after refused batch writes = %+v, want pending for H with most of %s left", rec, held.Lease)
	}
	if rec := get(t, s, good); rec.State != guard.StateCompleted || string(rec.Result) != "a" {
		t.Fatalf("record of the good write = %+v", rec)
	}
}

func (c contract) batchItems(t *testing.T, n int) []guard.BatchItem {
	items := make([]guard.BatchItem, n)
	for i := range items {
		items[i] = guard.BatchItem{Key: newKey(t), Fingerprint: "fp"}
	}
	return items
}

// doBatchOnce: a batch of fresh keys runs each effect once and stores its
// result; the batch again replays them all, and a batch naming a key
// twice runs it once.
func (c contract) doBatchOnce(t *testing.T) {
	s := c.h.New(t)
	// No lease needs to run out here: a long one keeps a batch claim
	// answered late on a loaded machine from being refused as too late
	// to use (as in doBatchMixed).
	g := guard.New(s, guard.Options{Lease: heldLease})
	items := c.batchItems(t, 20)
	runs := make([]atomic.Int32, len(items))
	fn := func(_ context.Context, i int, l guard.Lease) ([]byte, error) {
		runs[i].Add(1)
		if l.Key != items[i].Key || l.Attempt != 1 {
			t.Errorf("item %d ran under %+v", i, l)
		}
		return []byte(fmt.Sprint("r", i)), nil
	}
	for round, replayed := range []bool{false, true} {
		res := g.DoBatch(ctx, items, fn, guard.BatchOptions{Concurrency: 5})
		for i, r := range res {
			if r.Err != nil || r.Replayed != replayed || string(r.Value) != fmt.Sprint("r", i) {
				t.Errorf("round %d, item %d: %+v", round, i, r)
			}
		}
	}
	for i := range items {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("item %d ran %d times", i, n)
		}
		if rec := get(t, s, items[i].Key); rec.State != guard.StateCompleted || string(rec.Result) != fmt.Sprint("r", i) {
			t.Errorf("item %d: record %+v", i, rec)
		}
	}
	k := c.batchItems(t, 1)[0]
	var twice atomic.Int32
	res := g.DoBatch(ctx, []guard.BatchItem{k, items[0], k}, func(context.Context, int, guard.Lease) ([]byte, error) {
		twice.Add(1)
		return []byte("once"), nil
	}, guard.BatchOptions{Concurrency: 3})
	if twice.Load() != 1 || res[0].Err != nil || res[0].Replayed || !res[1].Replayed || res[2].Err != nil || !res[2].Replayed || string(res[2].Value) != "once" {
		t.Errorf("a key twice in one batch: %d runs, results %+v", twice.Load(), res)
	}
}

// doBatchMixed: through DoBatch, keys in every state get Do's answers.
func (c contract) doBatchMixed(t *testing.T) {
	s := c.h.New(t)
	reqs, want := c.mixedKeys(t, s)
	// No lease of the guard's needs to run out here: a long one keeps a
	// batch claim answered late on a loaded machine (a wrapper's claim
	// makes several round trips) from being refused as too late to use.
	g := guard.New(s, guard.Options{Lease: heldLease})
	items := make([]guard.BatchItem, len(reqs))
	for i, r := range reqs {
		items[i] = guard.BatchItem{Key: r.Key, Fingerprint: r.Fingerprint}
	}
	// The guard makes its own tokens: the key "this claim sent again" is
	// another holder's for it, in progress. Its one attempt limit applies
	// to every key of the batch: the failed key is then exhausted too.
	want[6] = guard.InProgress
	var ran []int
	var mu sync.Mutex
	res := g.DoBatch(ctx, items, func(_ context.Context, i int, l guard.Lease) ([]byte, error) {
		mu.Lock()
		ran = append(ran, i)
		mu.Unlock()
		return []byte("ok"), nil
	}, guard.BatchOptions{})
	for i, r := range res {
		var err error
		switch want[i] {
		case guard.Acquired:
			if r.Err != nil || r.Replayed || string(r.Value) != "ok" {
				err = fmt.Errorf("ran: %+v", r)
			}
		case guard.InProgress:
			var ip *guard.InProgressError
			if !errors.As(r.Err, &ip) || ip.RetryAfter <= 0 {
				err = fmt.Errorf("want *InProgressError: %v", r.Err)
			}
		case guard.Replay:
			if r.Err != nil || !r.Replayed || string(r.Value) != "done" {
				err = fmt.Errorf("want a replay: %+v", r)
			}
		case guard.Mismatch:
			if !errors.Is(r.Err, guard.ErrMismatch) || r.Value != nil {
				err = fmt.Errorf("want a mismatch: %+v", r)
			}
		case guard.Exhausted:
			// The guard has no attempt limit: the exhausted key (one
			// failed attempt) runs again.
			if r.Err != nil || r.Lease.Attempt != 2 {
				err = fmt.Errorf("want attempt 2: %+v", r)
			}
		}
		if err != nil {
			t.Errorf("%s: %v", items[i].Key, err)
		}
	}
	if len(ran) != 4 {
		t.Errorf("effects ran for items %v, want the fresh, failed, exhausted and recovered ones", ran)
	}
	if res[7].Lease.Fence != 2 || !res[7].Lease.Recovered {
		t.Errorf("recovered key's lease = %+v", res[7].Lease)
	}
}

// doBatchEach: in one batch, an effect that fails, one that panics, one
// that is rejected and one cut off by MaxRun each end as Do ends them
// (failed, released, released, failed), and every other key completes.
func (c contract) doBatchEach(t *testing.T) {
	s := c.h.New(t)
	// No lease needs to run out here (MaxRun cuts the slow effect): a
	// long one keeps a batch claim answered late on a loaded machine
	// from being refused as too late to use.
	g := guard.New(s, guard.Options{Lease: heldLease, MaxRun: 100 * time.Millisecond})
	items := c.batchItems(t, 8)
	boom := errors.New("boom")
	res := g.DoBatch(ctx, items, func(ctx context.Context, i int, _ guard.Lease) ([]byte, error) {
		switch i {
		case 1:
			return nil, boom
		case 3:
			panic(boom)
		case 5:
			return nil, fmt.Errorf("not now: %w", guard.ErrRejected)
		case 6:
			<-ctx.Done() // outlives its run: MaxRun ends it
			return nil, context.Cause(ctx)
		}
		return []byte("ok"), nil
	}, guard.BatchOptions{Concurrency: 3})
	for i, r := range res {
		rec, err := s.Get(ctx, items[i].Key)
		var bad bool
		switch i {
		case 1:
			bad = !errors.Is(r.Err, boom) || err != nil || rec.State != guard.StateFailed || rec.LastError != "boom"
		case 3:
			bad = !errors.Is(r.Err, guard.ErrPanicked) || !errors.Is(r.Err, boom) || !errors.Is(err, guard.ErrNotFound)
		case 5:
			bad = !errors.Is(r.Err, guard.ErrRejected) || !errors.Is(err, guard.ErrNotFound)
		case 6:
			bad = !errors.Is(r.Err, guard.ErrMaxRun) || err != nil || rec.State != guard.StateFailed
		default:
			bad = r.Err != nil || err != nil || rec.State != guard.StateCompleted || string(rec.Result) != "ok"
		}
		if bad {
			t.Errorf("item %d: %v; record %+v, %v", i, r.Err, rec, err)
		}
	}
}

// doBatchRace: goroutines run overlapping batches (keys in random order,
// some twice in a batch) over the same keys: each key's effect runs once.
func (c contract) doBatchRace(t *testing.T) {
	s := c.h.New(t)
	g := guard.New(s, guard.Options{Lease: 10 * time.Second})
	keys := max(c.h.Keys/5, 50)
	const workers, batches, size = 8, 12, 16
	prefix := rand.Text()[:8]
	effects := make([]atomic.Int32, keys)
	drawn := make([]atomic.Bool, keys)
	var answered atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := mrand.New(mrand.NewPCG(uint64(w), 7))
			for range batches {
				items := make([]guard.BatchItem, size)
				idx := make([]int, size)
				for j := range items {
					idx[j] = r.IntN(keys)
					drawn[idx[j]].Store(true)
					items[j] = guard.BatchItem{Key: guard.Key{Scope: "batch-race", ID: fmt.Sprintf("%s-%d", prefix, idx[j])}, Fingerprint: "fp"}
				}
				res := g.DoBatch(ctx, items, func(_ context.Context, j int, _ guard.Lease) ([]byte, error) {
					effects[idx[j]].Add(1)
					return []byte("ok"), nil
				}, guard.BatchOptions{Concurrency: 1 + w%4})
				for j, x := range res {
					if x.Err != nil && !errors.Is(x.Err, guard.ErrInProgress) {
						t.Errorf("item %d: %v", j, x.Err)
					}
					answered.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// A key some batch named ran once: whoever met it in progress met the
	// holder that ran it.
	for i := range effects {
		if n, want := effects[i].Load(), map[bool]int32{true: 1}[drawn[i].Load()]; n != want {
			t.Fatalf("key %d ran %d times, want %d", i, n, want)
		}
	}
	if answered.Load() != workers*batches*size {
		t.Fatalf("answered %d of %d", answered.Load(), workers*batches*size)
	}
}
