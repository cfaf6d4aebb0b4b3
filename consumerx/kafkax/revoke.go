package kafkax

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrRevoked is the cause (context.Cause) with which the context of a
// partition's running handler ends when a rebalance revokes the partition
// from this member or the member loses it (see OnPartitionsRevoked).
var ErrRevoked = errors.New("kafkax: partition revoked or lost in a rebalance")

// ErrRebalancing is the cause (context.Cause) with which the context of a
// poll's running handlers ends when a rebalance waits for the poll (a
// client made with kgo.BlockRebalanceOnPoll and OnPartitionsCallbackBlocked).
var ErrRebalancing = errors.New("kafkax: a rebalance waits for the poll")

// ErrRunning is returned by a Consumer's Run while another Run polls the
// same client (a second Consumer of it, or Run called again before it
// returned): the two would split a partition's records between them,
// running them out of order, and one's commit would pass the other's
// records not yet done. Run each member on a client of its own.
var ErrRunning = errors.New("kafkax: another Run is polling the client")

// OnPartitionsRevoked is kgo.OnPartitionsRevoked for a client a Consumer
// runs: give it in place of kgo's (with OnPartitionsLost) when making the
// client. When partitions are revoked while a Consumer's Run processes a
// poll of theirs, the contexts of their running handlers end with cause
// ErrRevoked (consumerx then reports a handler that returns an error as
// Interrupted and releases its claim, so the new owner runs the record at
// once instead of after the guard's lease), their records retried in place
// are retried no more, and their offsets are not committed (the new owner
// fetches them again from the last commit and finds those done
// Duplicates; if a partition is this member's again, a rebalance having
// given it back, its fetch goes back to the poll's first record of it).
// The member's other partitions go on, and the poll is committed for
// them. Then fn, if not nil, is called as kgo would call it.
//
// Without it the Consumer does not learn of revocations: a revoked
// partition's handlers run on, its failing record is retried in place,
// holding up the member's poll, and its offsets are committed after the
// rebalance. With kgo.BlockRebalanceOnPoll nothing is revoked while a poll
// runs (the rebalance waits until the Consumer allows it, after the poll's
// commit; OnPartitionsCallbackBlocked stops the poll so that it does not
// wait long), so this has nothing to stop. Either way the guard keeps
// every record's effect once.
func OnPartitionsRevoked(fn func(context.Context, *kgo.Client, map[string][]int32)) kgo.GroupOpt {
	return kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
		defer hold(cl, m)()
		revoke(cl, m)
		if fn != nil {
			fn(ctx, cl, m)
		}
	})
}

// OnPartitionsLost is kgo.OnPartitionsLost for a client a Consumer runs:
// partitions lost (the member fell out of the group) are stopped as
// OnPartitionsRevoked stops revoked ones; then fn, if not nil, is called.
// franz-go does not call OnPartitionsRevoked for lost partitions when
// OnPartitionsLost is not set: give both.
func OnPartitionsLost(fn func(context.Context, *kgo.Client, map[string][]int32)) kgo.GroupOpt {
	return kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
		// franz-go stops fetching lost partitions only once this returns:
		// a poll begun meanwhile may hold their records.
		defer hold(cl, m)()
		revoke(cl, m)
		if fn != nil {
			fn(ctx, cl, m)
		}
	})
}

// OnPartitionsCallbackBlocked is kgo.OnPartitionsCallbackBlocked for a
// client made with kgo.BlockRebalanceOnPoll that a Consumer runs: give it
// in place of kgo's when making the client. A rebalance then does not wait
// for the poll being processed (every member of the group waits with it,
// and the broker removes a member that keeps it waiting past
// kgo.RebalanceTimeout): the poll stops. Its running handlers see their
// context end with cause ErrRebalancing (consumerx reports a handler that
// then returns an error as Interrupted and releases its claim, with no
// attempt counted), its records retried in place are retried no more (a
// Failed record's attempt is already counted), each partition's records
// acknowledged from the poll's first on are committed, the partition's
// fetch goes back to its first record not acknowledged, and the rebalance
// is allowed. Whoever owns the partition after the rebalance, this member
// or another, fetches that record again and runs it (its attempts count
// on). Then fn, if not nil, is called, on a goroutine of its own as kgo
// calls it.
//
// Without it a record retried in place (Options.RetryDelay; for ever
// without an attempt limit) or a handler that does not return holds the
// rebalance until the poll is done or the broker removes the member; the
// removed member's records run on (one its handler holds is InProgress
// for the partition's new owner until that handler returns), and its
// commit fails (the new owner fetches the records again from the last
// commit and finds those done Duplicates). A handler that ignores its
// context holds the rebalance even with it. Either way the guard keeps
// every record's effect once.
func OnPartitionsCallbackBlocked(fn func(context.Context, *kgo.Client)) kgo.GroupOpt {
	return kgo.OnPartitionsCallbackBlocked(func(ctx context.Context, cl *kgo.Client) {
		forEach(cl, (*tracker).yield)
		if fn != nil {
			fn(ctx, cl)
		}
	})
}

// tracking is every running Consumer's tracker, by client: a rebalance
// callback is given the client, not the Consumer (made after the client).
var tracking struct {
	sync.Mutex
	m map[*kgo.Client]map[*tracker]struct{}
	// held: the partitions of cl whose revocation callback runs; a poll
	// taking their records meanwhile takes them revoked.
	held map[*kgo.Client]map[topicPartition]int
}

// hold marks the partitions m of cl as being revoked until the returned
// func is called.
func hold(cl *kgo.Client, m map[string][]int32) (release func()) {
	tracking.Lock()
	defer tracking.Unlock()
	if tracking.held == nil {
		tracking.held = map[*kgo.Client]map[topicPartition]int{}
	}
	if tracking.held[cl] == nil {
		tracking.held[cl] = map[topicPartition]int{}
	}
	for topic, ps := range m {
		for _, p := range ps {
			tracking.held[cl][topicPartition{topic, p}]++
		}
	}
	return func() {
		tracking.Lock()
		defer tracking.Unlock()
		for topic, ps := range m {
			for _, p := range ps {
				tp := topicPartition{topic, p}
				if tracking.held[cl][tp]--; tracking.held[cl][tp] <= 0 {
					delete(tracking.held[cl], tp)
				}
			}
		}
		if len(tracking.held[cl]) == 0 {
			delete(tracking.held, cl)
		}
	}
}

// held reports whether tp of cl is being revoked.
func held(cl *kgo.Client, tp topicPartition) bool {
	tracking.Lock()
	defer tracking.Unlock()
	return tracking.held[cl][tp] > 0
}

// revoke stops the partitions m of every poll running on cl.
func revoke(cl *kgo.Client, m map[string][]int32) {
	forEach(cl, func(tr *tracker) { tr.revoke(m) })
}

// forEach calls fn with every tracker of cl.
func forEach(cl *kgo.Client, fn func(*tracker)) {
	tracking.Lock()
	trs := make([]*tracker, 0, len(tracking.m[cl]))
	for tr := range tracking.m[cl] {
		trs = append(trs, tr)
	}
	tracking.Unlock()
	for _, tr := range trs {
		fn(tr)
	}
}

// topicPartition names a partition.
type topicPartition struct {
	topic     string
	partition int32
}

// tracker follows one Run's partitions of the poll being processed, so
// that a revocation can stop them. It never blocks the rebalance: revoke
// cancels and returns, without waiting for a handler.
type tracker struct {
	cl    *kgo.Client
	mu    sync.Mutex
	seq   uint64                     // revocations and waiting rebalances seen
	last  map[topicPartition]uint64  // the seq of each partition's last revocation
	wait  uint64                     // the seq of the last waiting rebalance
	parts map[topicPartition][]*part // the poll's
}

// part is one partition's records of a poll.
type part struct {
	ctx     context.Context // ends with the Run's, or with ErrRevoked or ErrRebalancing
	cancel  context.CancelCauseFunc
	recs    []*kgo.Record
	revoked bool         // under tracker.mu
	yielded bool         // stopped for a waiting rebalance; under tracker.mu
	stopped atomic.Bool  // its records were left unfinished
	acked   atomic.Int32 // its records acknowledged, from the first
}

// track starts following cl's revocations for a Run; untrack ends it.
// It fails with ErrRunning while another Run follows cl.
func track(cl *kgo.Client) (*tracker, error) {
	tr := &tracker{cl: cl, last: map[topicPartition]uint64{}, parts: map[topicPartition][]*part{}}
	tracking.Lock()
	defer tracking.Unlock()
	if len(tracking.m[cl]) > 0 {
		return nil, ErrRunning
	}
	if tracking.m == nil {
		tracking.m = map[*kgo.Client]map[*tracker]struct{}{}
	}
	if tracking.m[cl] == nil {
		tracking.m[cl] = map[*tracker]struct{}{}
	}
	tracking.m[cl][tr] = struct{}{}
	return tr, nil
}

func (tr *tracker) untrack() {
	tracking.Lock()
	defer tracking.Unlock()
	delete(tracking.m[tr.cl], tr)
	if len(tracking.m[tr.cl]) == 0 {
		delete(tracking.m, tr.cl)
	}
}

// mark returns the revocations and waiting rebalances seen so far: taken
// before a poll, it tells add which of the poll's partitions were revoked,
// or whether a rebalance began to wait for it, while it was fetched.
func (tr *tracker) mark() uint64 {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.seq
}

// revoke ends the contexts of the partitions m with ErrRevoked.
func (tr *tracker) revoke(m map[string][]int32) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	for topic, ps := range m {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			tr.last[tp] = tr.seq
			for _, pt := range tr.parts[tp] {
				pt.revoked = true
				pt.cancel(ErrRevoked)
			}
		}
	}
}

// yield ends the contexts of the poll's partitions not revoked with
// ErrRebalancing: a rebalance waits for the poll.
func (tr *tracker) yield() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.seq++
	tr.wait = tr.seq
	for _, pts := range tr.parts {
		for _, pt := range pts {
			if !pt.revoked {
				pt.yielded = true
				pt.cancel(ErrRebalancing)
			}
		}
	}
}

// add follows a partition's records of the poll that began at mark since,
// under a context of ctx; one revoked since then starts revoked, and one
// of a poll a rebalance waits for starts stopped.
func (tr *tracker) add(ctx context.Context, topic string, partition int32, recs []*kgo.Record, since uint64) *part {
	pctx, cancel := context.WithCancelCause(ctx)
	pt := &part{ctx: pctx, cancel: cancel, recs: recs}
	tp := topicPartition{topic, partition}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	switch {
	case tr.last[tp] > since, held(tr.cl, tp):
		pt.revoked = true
		cancel(ErrRevoked)
	case tr.wait > since:
		pt.yielded = true
		cancel(ErrRebalancing)
	}
	tr.parts[tp] = append(tr.parts[tp], pt)
	return pt
}

// done ends the poll's partitions, once each one's records returned, and
// returns the records to commit: those of the partitions not revoked, and
// of one stopped for a waiting rebalance those acknowledged from the first
// (the rebalance has not run: the member holds the partition), its fetch
// going back to the record after them.
// stopped is whether a partition not revoked was left unfinished (the Run
// is stopping): then nothing is to be committed. rewind is where each
// revoked partition's fetch must go back to, its first record of the
// poll, should the member hold it (again): a partition revoked and given
// back (an eager rebalance gives a member the partitions it had) is
// fetched on past the poll's records, which may not have run, and the
// next poll's commit would pass them (kgo.Client.SetOffsets skips a
// partition the member does not hold). A partition left unfinished goes
// back to its first record not acknowledged, for the same reason: a Run
// started again on the client (after this one stopped) would otherwise
// fetch on past records that never ran and commit past them.
func (tr *tracker) done() (commit []*kgo.Record, stopped bool, rewind map[string]map[int32]kgo.EpochOffset) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for tp, pts := range tr.parts {
		delete(tr.parts, tp)
		for _, pt := range pts {
			pt.cancel(nil)
			switch {
			case pt.revoked:
				rewind = rewindTo(rewind, tp, pt.recs[0])
			case pt.yielded:
				n := int(pt.acked.Load())
				commit = append(commit, pt.recs[:n]...)
				if n < len(pt.recs) {
					rewind = rewindTo(rewind, tp, pt.recs[n])
				}
			case pt.stopped.Load():
				stopped = true
				if n := int(pt.acked.Load()); n < len(pt.recs) {
					rewind = rewindTo(rewind, tp, pt.recs[n])
				}
			default:
				commit = append(commit, pt.recs...)
			}
		}
	}
	if stopped {
		commit = nil
	}
	return commit, stopped, rewind
}

// rewindTo sets rewind's offset of tp to r's, unless it is at an earlier
// record already, and returns rewind.
func rewindTo(rewind map[string]map[int32]kgo.EpochOffset, tp topicPartition, r *kgo.Record) map[string]map[int32]kgo.EpochOffset {
	if rewind == nil {
		rewind = map[string]map[int32]kgo.EpochOffset{}
	}
	if rewind[tp.topic] == nil {
		rewind[tp.topic] = map[int32]kgo.EpochOffset{}
	}
	if at, ok := rewind[tp.topic][tp.partition]; !ok || r.Offset < at.Offset {
		rewind[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset}
	}
	return rewind
}
