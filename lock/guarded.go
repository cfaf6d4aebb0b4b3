package lock

import (
	"context"
	"fmt"

	"github.com/idemguard/idemguard/guard"
)

// Guarded returns fn wrapped to run inside the lock named resource, for
// use with guard.Guard.Do: the guard makes each idempotency key run once,
// the lock makes runs of different keys that touch one resource (an
// account, an order) never overlap.
//
//	res, err := g.Do(ctx, key, fp, lock.Guarded(l, "account:"+acct, charge))
//
// fn's context is cancelled when either the guard's lease (cause
// guard.ErrLeaseLost) or the lock (cause ErrLost) is lost. If the lock
// cannot be obtained, fn does not run and the wrapped function returns the
// lock's error (ErrNotObtained, ErrUnavailable) joined with
// guard.ErrRejected, so the guard releases the key instead of counting a
// failed attempt (returned by a consumerx handler, it counts as every
// handler error does: a message whose resource is never free is
// dead-lettered after MaxAttempts, not retried for ever). Once fn has run, its own result and error are
// returned unchanged, so a completed effect is stored and not run again.
// Inside fn, FromContext(ctx) is the resource's lock (its Fence, with
// Options.Fencing).
//
// It panics on a nil l or fn, as http.Handle does on a nil handler: the
// wrapped function could never run.
func Guarded(l *Locker, resource string, fn guard.Func) guard.Func {
	return GuardedBy(l, func(context.Context, guard.Lease) (string, error) { return resource, nil }, fn)
}

// GuardedBy is Guarded with the resource derived per call, from the
// request's context or the lease (its Key). An error from resource is
// returned, joined with guard.ErrRejected, without running fn. It panics
// on a nil l, resource or fn.
func GuardedBy(l *Locker, resource func(ctx context.Context, lease guard.Lease) (string, error), fn guard.Func) guard.Func {
	switch {
	case l == nil:
		panic("lock.Guarded: nil Locker")
	case resource == nil:
		panic("lock.GuardedBy: nil resource func")
	case fn == nil:
		panic("lock.Guarded: nil guard.Func")
	}
	return func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		name, err := resource(ctx, lease)
		if err != nil {
			return nil, fmt.Errorf("lock: resource for %s: %w: %w", lease.Key, guard.ErrRejected, err)
		}
		var (
			value []byte
			ferr  error
			ran   bool
		)
		err = l.Do(ctx, name, func(ctx context.Context) error {
			ran = true
			value, ferr = fn(ctx, lease)
			return ferr
		})
		switch {
		case !ran:
			return nil, fmt.Errorf("%s: %w: %w", lease.Key, guard.ErrRejected, err)
		case ferr != nil:
			return value, err // fn's error, and ErrLost if the lock was lost
		default:
			return value, nil
		}
	}
}
