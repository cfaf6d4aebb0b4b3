package lock

import "context"

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
		lk, err := l.obtain(ctx, name, singletonTries, singletonTries)
		if err != nil {
			return err
		}
		return lk.run(ctx, job)
	}
}
