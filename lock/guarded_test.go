package lock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/internal/testenv/guardenv"
	"github.com/idemguard/idemguard/lock"
)

func newGuard(t *testing.T, opts guard.Options) (*guard.Guard, *guard.RedisStore) {
	t.Helper()
	s := guardenv.Store(t, guard.RedisOptions{})
	return guard.New(s, opts), s
}

// TestGuardedNeverOverlap: 16 idempotency keys on one account, each sent
// 3 times at once (48 goroutines, 2 Lockers as 2 processes). Every key's
// effect runs exactly once (the guard), and no two effects on the account
// overlap (the lock): a plain balance read-modify-write loses nothing.
func TestGuardedNeverOverlap(t *testing.T) {
	const keys, dups = 16, 3
	g, _ := newGuard(t, guard.Options{})
	prefix := testenv.Prefix(t)
	lockers := []*lock.Locker{
		newLocker(t, redlockNodes(t), lock.Options{Prefix: prefix, RetryDelay: 10 * time.Millisecond}),
		newLocker(t, redlockNodes(t), lock.Options{Prefix: prefix, RetryDelay: 10 * time.Millisecond}),
	}
	var (
		balance int // plain on purpose
		sec     section
		mu      sync.Mutex
		effects = map[string]int{}
		wg      sync.WaitGroup
	)
	errs := make(chan error, keys*dups)
	for k := range keys {
		for d := range dups {
			wg.Go(func() {
				id := fmt.Sprintf("payment-%d", k)
				key := guard.Key{Scope: "acct-42/POST /payments", ID: id}
				res, err := g.Do(bg, key, "fp-"+id, lock.Guarded(lockers[(k+d)%2], "account:42", func(ctx context.Context, lease guard.Lease) ([]byte, error) {
					sec.enter()
					defer sec.exit()
					b := balance
					runtime.Gosched()
					balance = b + 10
					mu.Lock()
					effects[id]++
					mu.Unlock()
					return []byte("paid " + id), nil
				}))
				switch {
				case errors.Is(err, guard.ErrInProgress): // a duplicate while the first runs
				case err != nil:
					errs <- fmt.Errorf("%s: %w", id, err)
				case string(res.Value) != "paid "+id:
					errs <- fmt.Errorf("%s: result %q", id, res.Value)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	sec.check(t)
	if len(effects) != keys || balance != 10*keys {
		t.Fatalf("%d keys ran, balance %d; want %d and %d", len(effects), balance, keys, 10*keys)
	}
	for id, n := range effects {
		if n != 1 {
			t.Errorf("%s ran %d times", id, n)
		}
	}
}

// TestGuardedDifferentResources: effects on different resources run at
// the same time: the lock is per resource, not global.
func TestGuardedDifferentResources(t *testing.T) {
	g, _ := newGuard(t, guard.Options{})
	l := newLocker(t, redlockNodes(t), lock.Options{})
	inA := make(chan struct{})
	inB := make(chan struct{})
	errs := make(chan error, 2)
	run := func(id, resource string, mine, other chan struct{}) {
		_, err := g.Do(bg, guard.Key{Scope: "s", ID: id}, "fp", lock.Guarded(l, resource, func(ctx context.Context, _ guard.Lease) ([]byte, error) {
			close(mine)
			select {
			case <-other: // both inside at once
				return nil, nil
			case <-time.After(5 * time.Second):
				return nil, errors.New("the other resource's effect never ran alongside")
			}
		}))
		errs <- err
	}
	go run("a", "account:1", inA, inB)
	go run("b", "account:2", inB, inA)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestGuardedLockLost: fn's context is cancelled with ErrLost when the
// resource lock is lost; the wrapped function reports it with fn's error.
func TestGuardedLockLost(t *testing.T) {
	g, _ := newGuard(t, guard.Options{})
	nodes := redlockNodes(t)
	l := newLocker(t, nodes, lock.Options{Expiry: 600 * time.Millisecond})
	key := guard.Key{Scope: "s", ID: "lock-lost"}
	_, err := g.Do(bg, key, "fp", lock.Guarded(l, "acct", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
		for _, c := range nodes {
			if err := c.Del(bg, l.Options().Prefix+"acct").Err(); err != nil {
				return nil, err
			}
		}
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}))
	if !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Do = %v, want ErrLost", err)
	}
	rec, err := g.Get(bg, key)
	if err != nil || rec.State != guard.StateFailed {
		t.Fatalf("record after a lost lock: %+v, %v; want failed (retryable)", rec, err)
	}
}

// TestGuardedLeaseLost: fn's context is cancelled with guard.ErrLeaseLost
// when the guard's lease is lost, although the lock is still held.
func TestGuardedLeaseLost(t *testing.T) {
	// 1s, extended every 333ms: the lease must outlive the claim, the lock's
	// round and the DEL on a loaded machine, so that it is lost by the DEL.
	g, store := newGuard(t, guard.Options{Lease: time.Second})
	l := newLocker(t, redlockNodes(t), lock.Options{})
	key := guard.Key{Scope: "s", ID: "lease-lost"}
	rdb := testenv.Redis(t) // the store's server, behind its back
	_, err := g.Do(bg, key, "fp", lock.Guarded(l, "acct", func(ctx context.Context, _ guard.Lease) ([]byte, error) {
		if err := rdb.Del(bg, store.Name(key)).Err(); err != nil {
			return nil, err
		}
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}))
	if !errors.Is(err, guard.ErrLeaseLost) || errors.Is(err, lock.ErrLost) {
		t.Fatalf("Do = %v, want guard.ErrLeaseLost only", err)
	}
	// The lock was released when fn returned.
	if err := l.TryDo(bg, "acct", func(context.Context) error { return nil }); err != nil {
		t.Fatalf("lock still held: %v", err)
	}
}

// TestGuardedNotObtained: when the resource lock cannot be had, fn does not
// run, the lock's error comes back and the key can be tried again.
func TestGuardedNotObtained(t *testing.T) {
	g, _ := newGuard(t, guard.Options{})
	l := newLocker(t, redlockNodes(t), lock.Options{})
	held, err := l.Obtain(bg, "acct")
	if err != nil {
		t.Fatal(err)
	}
	key := guard.Key{Scope: "s", ID: "busy-resource"}
	ran := 0
	fn := func(context.Context, guard.Lease) ([]byte, error) { ran++; return []byte("ok"), nil }
	// The deadline also bounds the guard's claim: at 200ms a loaded
	// machine could spend it there, before the lock was tried.
	ctx, cancel := context.WithTimeout(bg, time.Second)
	defer cancel()
	_, err = g.Do(ctx, key, "fp", lock.Guarded(l, "acct", fn))
	if !errors.Is(err, lock.ErrNotObtained) || ran != 0 {
		t.Fatalf("Do with the resource held = %v (ran %d), want ErrNotObtained", err, ran)
	}
	if !errors.Is(err, guard.ErrRejected) {
		t.Fatalf("Do with the resource held = %v, want it marked guard.ErrRejected", err)
	}
	if _, err := g.Get(bg, key); !errors.Is(err, guard.ErrNotFound) {
		t.Fatalf("key after a rejected run = %v, want released (ErrNotFound), no attempt counted", err)
	}
	if err := held.Release(bg); err != nil {
		t.Fatal(err)
	}
	res, err := g.Do(bg, key, "fp", lock.Guarded(l, "acct", fn))
	if err != nil || string(res.Value) != "ok" || ran != 1 || res.Lease.Attempt != 1 {
		t.Fatalf("retry = %+v, %v (ran %d), want the first attempt", res, err, ran)
	}

	bad := errors.New("no account in request")
	_, err = g.Do(bg, guard.Key{Scope: "s", ID: "no-resource"}, "fp", lock.GuardedBy(l,
		func(context.Context, guard.Lease) (string, error) { return "", bad }, fn))
	if !errors.Is(err, bad) || ran != 1 {
		t.Fatalf("GuardedBy with a failing resource = %v (ran %d)", err, ran)
	}
	_, err = g.Do(bg, guard.Key{Scope: "s", ID: "empty-resource"}, "fp", lock.Guarded(l, "", fn))
	if !errors.Is(err, lock.ErrInvalidName) || ran != 1 {
		t.Fatalf("Guarded with an empty resource = %v (ran %d)", err, ran)
	}
}
