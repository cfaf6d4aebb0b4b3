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
// commit), so this has nothing to stop. Either way the guard keeps every
// record's effect once.
func OnPartitionsRevoked(fn func(context.Context, *kgo.Client, map[string][]int32)) kgo.GroupOpt {
	return kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
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
		revoke(cl, m)
		if fn != nil {
			fn(ctx, cl, m)
		}
	})
}

// tracking is every running Consumer's tracker, by client: a rebalance
// callback is given the client, not the Consumer (made after the client).
var tracking struct {
	sync.Mutex
	m map[*kgo.Client]map[*tracker]struct{}
}

// revoke stops the partitions m of every poll running on cl.
func revoke(cl *kgo.Client, m map[string][]int32) {
	tracking.Lock()
	trs := make([]*tracker, 0, len(tracking.m[cl]))
	for tr := range tracking.m[cl] {
		trs = append(trs, tr)
	}
	tracking.Unlock()
	for _, tr := range trs {
		tr.revoke(m)
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
	seq   uint64                     // revocations seen
	last  map[topicPartition]uint64  // the seq of each partition's last revocation
	parts map[topicPartition][]*part // the poll's
}

// part is one partition's records of a poll.
type part struct {
	ctx     context.Context // ends with the Run's, or with ErrRevoked
	cancel  context.CancelCauseFunc
	recs    []*kgo.Record
	revoked bool        // under tracker.mu
	stopped atomic.Bool // its records were left unfinished
}

// track starts following cl's revocations for a Run; untrack ends it.
func track(cl *kgo.Client) *tracker {
	tr := &tracker{cl: cl, last: map[topicPartition]uint64{}, parts: map[topicPartition][]*part{}}
	tracking.Lock()
	defer tracking.Unlock()
	if tracking.m == nil {
		tracking.m = map[*kgo.Client]map[*tracker]struct{}{}
	}
	if tracking.m[cl] == nil {
		tracking.m[cl] = map[*tracker]struct{}{}
	}
	tracking.m[cl][tr] = struct{}{}
	return tr
}

func (tr *tracker) untrack() {
	tracking.Lock()
	defer tracking.Unlock()
	delete(tracking.m[tr.cl], tr)
	if len(tracking.m[tr.cl]) == 0 {
		delete(tracking.m, tr.cl)
	}
}

// mark returns the revocations seen so far: taken before a poll, it tells
// add which of the poll's partitions were revoked while it was fetched.
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

// add follows a partition's records of the poll that began at mark since,
// under a context of ctx; one revoked since then starts revoked.
func (tr *tracker) add(ctx context.Context, topic string, partition int32, recs []*kgo.Record, since uint64) *part {
	pctx, cancel := context.WithCancelCause(ctx)
	pt := &part{ctx: pctx, cancel: cancel, recs: recs}
	tp := topicPartition{topic, partition}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.last[tp] > since {
		pt.revoked = true
		cancel(ErrRevoked)
	}
	tr.parts[tp] = append(tr.parts[tp], pt)
	return pt
}

// done ends the poll's partitions, once each one's records returned, and
// returns the records to commit: those of the partitions not revoked.
// stopped is whether a partition not revoked was left unfinished (the Run
// is stopping): then nothing is to be committed. rewind is where each
// revoked partition's fetch must go back to, its first record of the
// poll, should the member hold it (again): a partition revoked and given
// back (an eager rebalance gives a member the partitions it had) is
// fetched on past the poll's records, which may not have run, and the
// next poll's commit would pass them (kgo.Client.SetOffsets skips a
// partition the member does not hold).
func (tr *tracker) done() (commit []*kgo.Record, stopped bool, rewind map[string]map[int32]kgo.EpochOffset) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for tp, pts := range tr.parts {
		delete(tr.parts, tp)
		for _, pt := range pts {
			pt.cancel(nil)
			switch {
			case pt.revoked:
				first := pt.recs[0]
				if rewind == nil {
					rewind = map[string]map[int32]kgo.EpochOffset{}
				}
				if rewind[tp.topic] == nil {
					rewind[tp.topic] = map[int32]kgo.EpochOffset{}
				}
				if at, ok := rewind[tp.topic][tp.partition]; !ok || first.Offset < at.Offset {
					rewind[tp.topic][tp.partition] = kgo.EpochOffset{Epoch: first.LeaderEpoch, Offset: first.Offset}
				}
			case pt.stopped.Load():
				stopped = true
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
