package lock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// pauseAfterFenceRead is a go-redis hook that, once armed, holds every
// reply to a GET of a fence counter until gate is closed, as if the
// process stalled (a GC pause, a stopped VM) after reading the counters
// and before raising them. arrived gets one value per held reply.
type pauseAfterFenceRead struct {
	gate    chan struct{}
	arrived chan struct{}
}

func (h *pauseAfterFenceRead) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pauseAfterFenceRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *pauseAfterFenceRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if cmd.Name() == "get" && len(args) == 2 && strings.HasSuffix(args[1].(string), ":fence") {
			h.arrived <- struct{}{}
			<-h.gate // the stall: nothing runs in this process meanwhile
		}
		return err
	}
}

// obtained is a TryObtain's result, sent by the goroutine that called it.
type obtained struct {
	k   *lock.Lock
	err error
}

// obtainPaused runs a.TryObtain(bg, name) on wg and returns once h has
// held n of its fence reads, its result to come on the channel. If
// TryObtain returns first, it opens h's gate and fails t, unless the
// acquisition reached no quorum (ErrUnavailable: a loaded machine missed
// the round's timeout; no fence was read, nothing is held), which is
// tried again a few times.
func (h *pauseAfterFenceRead) obtainPaused(t *testing.T, wg *sync.WaitGroup, a *lock.Locker, name string, n int) <-chan obtained {
	t.Helper()
	resA := make(chan obtained, 1)
	for try := 1; ; try++ {
		wg.Go(func() {
			k, err := a.TryObtain(bg, name)
			resA <- obtained{k, err}
		})
		select {
		case <-h.arrived:
			for range n - 1 {
				select {
				case <-h.arrived:
				case r := <-resA:
					close(h.gate)
					t.Fatalf("A's TryObtain returned before reading every fence: %v", r.err)
				}
			}
			return resA
		case r := <-resA:
			if errors.Is(r.err, lock.ErrUnavailable) && try < 5 {
				continue
			}
			close(h.gate)
			t.Fatalf("A's TryObtain returned before reading the fences: %v", r.err)
		}
	}
}

// TestFenceOfHolderStalledBeforeRaise: holder A takes the lock, reads the
// fence counters, and stalls past its lock's validity before raising
// them. Holder B takes the lock meanwhile and its fence. When A wakes up,
// its Obtain must not hand out a lock whose fence is not below B's: a
// store that keeps the highest fence would accept both holders' writes.
// (The fence was taken from counters read while A held the lock, but
// raised after A had lost it, to the same number B took.)
func TestFenceOfHolderStalledBeforeRaise(t *testing.T) {
	// Rounds of 200ms (Expiry*TimeoutFactor): at 300ms, rounds of 60ms
	// (dials of new connections included) were missed under load.
	const expiry = time.Second
	prefix := testenv.Prefix(t)
	t.Cleanup(func() {
		for _, c := range redlockNodes(t) {
			_ = c.Del(bg, prefix+"stall:fence").Err()
		}
	})
	addrs := testenv.List(t, testenv.EnvRedlock)
	hook := &pauseAfterFenceRead{gate: make(chan struct{}), arrived: make(chan struct{}, len(addrs))}
	nodesA := closing(t, lock.NewNodes(addrs...))
	for _, c := range nodesA {
		c.AddHook(hook)
	}
	opts := lock.Options{Prefix: prefix, Expiry: expiry, Fencing: true, RetryDelay: 10 * time.Millisecond}
	a := newLocker(t, nodesA, opts)
	b := newLocker(t, redlockNodes(t), opts)

	var wg sync.WaitGroup
	defer wg.Wait()
	resA := hook.obtainPaused(t, &wg, a, "stall", len(addrs)) // A holds the lock and has read every counter

	// B waits for A's lock to expire, then takes it and its fence.
	ctx, cancel := context.WithTimeout(bg, 20*time.Second)
	defer cancel()
	kb, err := b.Obtain(ctx, "stall")
	if err != nil {
		close(hook.gate)
		t.Fatalf("B's Obtain: %v", err)
	}
	defer func() { _ = kb.Release(bg) }()
	close(hook.gate) // A wakes up and raises the counters

	r := <-resA
	if r.err != nil {
		t.Logf("A's Obtain after its stall: %v", r.err)
		if !errors.Is(r.err, lock.ErrNotObtained) && !errors.Is(r.err, lock.ErrUnavailable) {
			t.Fatalf("A's Obtain = %v, want ErrNotObtained or ErrUnavailable", r.err)
		}
		return
	}
	defer func() { _ = r.k.Release(bg) }()
	if r.k.Fence() >= kb.Fence() {
		t.Fatalf("A (stalled, lock expired) got fence %d, B (took the lock after A's expired) fence %d: "+
			"A's fence must be below B's, or A must not get the lock", r.k.Fence(), kb.Fence())
	}
}

// TestUntilWithinServerExpiry: a lock's validity (Until) must end before
// a quorum of nodes can let the key go, by the servers' own expiry
// times. Redis keeps expiries in whole milliseconds (PX): an Expiry with
// a fraction of a millisecond is cut to the millisecond on the nodes, and
// the validity must be reckoned from what the nodes were told, or it ends
// after the key does (by up to the fraction, more than the 1% drift
// allowance for a short Expiry) and another holder can take the lock
// while this one believes it holds it.
func TestUntilWithinServerExpiry(t *testing.T) {
	const expiry = 30*time.Millisecond + 999*time.Microsecond
	nodes := redlockNodes(t)
	l := newLocker(t, nodes, lock.Options{Expiry: expiry, RetryDelay: time.Millisecond})
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	compared := 0
	for i := 0; i < 400 && compared < 40; i++ {
		k, err := l.Obtain(ctx, "until")
		if errors.Is(err, lock.ErrUnavailable) {
			continue // a loaded machine missed the nodes' per-call timeout, a fraction of 31ms
		}
		if err != nil {
			t.Fatal(err)
		}
		until := k.Until()
		var ends []int64 // each node's expiry, unix ms; the key lives through that millisecond
		for _, c := range nodes {
			v, err := c.Get(bg, k.Key()).Result()
			if err != nil || v == "" {
				continue // not held there (or already gone)
			}
			ms, err := c.Do(bg, "PEXPIRETIME", k.Key()).Int64()
			if err != nil {
				t.Fatal(err)
			}
			if ms > 0 {
				ends = append(ends, ms)
			}
		}
		// A loaded machine can miss the release's per-node timeout too;
		// the key then expires on its own, a few milliseconds later.
		if err := k.Release(bg); err != nil && !errors.Is(err, lock.ErrLost) && !errors.Is(err, lock.ErrUnavailable) {
			t.Fatal(err)
		}
		if len(ends) < l.Quorum() {
			continue // expired before we looked: nothing to compare
		}
		// Another holder can take the lock once a quorum of all nodes is
		// free: those that never held this one's key, and the earliest of
		// those that did to let it go.
		slices.Sort(ends)
		free := time.UnixMilli(ends[l.Quorum()-(len(nodes)-len(ends))-1] + 1)
		if until.After(free) {
			t.Fatalf("attempt %d: Until %s is %s after the nodes can let the key go (%s); expiries %v",
				i, until.Format("15:04:05.000000"), until.Sub(free), free.Format("15:04:05.000000"), ends)
		}
		compared++
	}
	if compared < 5 {
		t.Fatalf("only %d locks were compared with the nodes' expiries: the test tested nothing", compared)
	}
}
