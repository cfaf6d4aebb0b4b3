package lock

import (
	"context"
	"errors"
	"time"

	"github.com/go-redsync/redsync/v4"
)

// singletonTries is how many attempts Singleton makes before it skips.
const singletonTries = 3

// Singleton returns job wrapped so that, among every process whose Locker
// shares these nodes, at most one runs it at a time: for a purge, a reaper
// or any periodic job that several instances schedule. A call while
// another instance runs it returns ErrNotObtained without running job (the
// caller skips this round); ErrUnavailable when no quorum of nodes
// answers. job's context is cancelled with cause ErrLost if the lock is
// lost while it runs.
//
// Unlike TryDo, it makes up to 3 attempts, Options.RetryDelay apart:
// instances that start the job at the same moment would otherwise often
// all lose on split votes (each taking one node) and none would run it.
// An attempt that finds the lock held by another on every node is not
// repeated: that instance runs the job this round, and waiting it out
// would run the job again. (One that holds it on a bare quorum, a node
// having missed its lock, looks like a split vote: a job that ends before
// this instance's last attempt may then run again in the round, one
// shorter than 2 × Options.RetryDelay at least, and with a node that does
// not answer, each attempt lasting its bound of Expiry × TimeoutFactor,
// one shorter than 2 × (RetryDelay + Expiry × TimeoutFactor).)
//
// It panics on a nil l or job, as http.Handle does on a nil handler.
func Singleton(l *Locker, name string, job func(ctx context.Context) error) func(ctx context.Context) error {
	switch {
	case l == nil:
		panic("lock.Singleton: nil Locker")
	case job == nil:
		panic("lock.Singleton: nil job")
	}
	return func(ctx context.Context) error {
		var timer *time.Timer
		defer func() {
			if timer != nil {
				timer.Stop()
			}
		}()
		for attempt := 1; ; attempt++ {
			lk, err := l.obtain(ctx, name, 1, 1)
			if err == nil {
				return lk.run(ctx, job)
			}
			if ctx.Err() != nil && !errors.Is(err, context.Cause(ctx)) {
				return l.waitErr(ctx, name, err)
			}
			if attempt >= singletonTries || l.heldEverywhere(err) || ctx.Err() != nil ||
				!errors.Is(err, ErrNotObtained) && !errors.Is(err, ErrUnavailable) {
				return err
			}
			if timer == nil {
				timer = time.NewTimer(l.retryDelay())
			} else {
				timer.Reset(l.retryDelay())
			}
			select {
			case <-ctx.Done():
				return l.waitErr(ctx, name, err)
			case <-timer.C:
			}
		}
	}
}

// heldEverywhere reports whether err is an acquisition that found the
// lock held by another on every node: an instance holds it and runs the
// job. redsync's ErrTaken alone does not say so: it counts the nodes held
// by others once they make a quorum, and three instances that each took
// one node of three (a split vote, which each releases at once) each
// find the two others' nodes taken.
func (l *Locker) heldEverywhere(err error) bool {
	var p *redsync.ErrTaken
	if errors.As(err, &p) && p != nil {
		return len(p.Nodes) >= l.nodes
	}
	var v redsync.ErrTaken
	return errors.As(err, &v) && len(v.Nodes) >= l.nodes
}
