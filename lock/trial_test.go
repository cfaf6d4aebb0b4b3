package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// TestCancelledMidAcquireLeavesNothingLocked: 12 goroutines race Do on one
// name, with Fencing, each call under a deadline drawn from 0 to 30ms, so
// that many end while their acquisition or fence rounds are under way.
// No two sections overlap, every call either ran its section or failed
// with ErrNotObtained matching the context's error, and once all have
// returned the lock is free at once (TryObtain takes it on its first
// attempt): no cancelled acquisition left its keys behind.
func TestCancelledMidAcquireLeavesNothingLocked(t *testing.T) {
	const goroutines, calls = 12, 15
	_, nodes := ownNodes(t, 3)
	l := newLocker(t, nodes, lock.Options{Expiry: 10 * time.Second, Fencing: true, RetryDelay: 2 * time.Millisecond})
	var (
		sec        section
		ran, ended atomic.Int32
		wg         sync.WaitGroup
		errs       = make(chan error, goroutines*calls)
	)
	for range goroutines {
		wg.Go(func() {
			for range calls {
				ctx, cancel := context.WithTimeout(bg, rand.N(30*time.Millisecond))
				err := l.Do(ctx, "acct", func(ctx context.Context) error {
					sec.enter()
					defer sec.exit()
					ran.Add(1)
					return nil
				})
				cancel()
				switch {
				case err == nil:
				case errors.Is(err, lock.ErrNotObtained) && errors.Is(err, context.DeadlineExceeded):
					ended.Add(1)
				default:
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if sec.max.Load() > 1 {
		t.Fatalf("%d sections overlapped", sec.max.Load())
	}
	t.Logf("%d sections ran, %d calls ended waiting", ran.Load(), ended.Load())
	k, err := l.TryObtain(bg, "acct")
	if err != nil {
		t.Fatalf("TryObtain after every call returned = %v: a cancelled acquisition left the lock taken", err)
	}
	if err := k.Release(bg); err != nil {
		t.Fatal(err)
	}
	for i, c := range nodes {
		if n, err := c.Exists(bg, k.Key()).Result(); err != nil || n != 0 {
			t.Fatalf("node %d: EXISTS %s = %d, %v after release", i, k.Key(), n, err)
		}
	}
}

// TestSingletonChurnWithRestartedNodes: 4 instances run a Singleton job
// in loops on 3 private nodes, with Fencing, while one node at a time is
// killed and restarted empty (no persistence), three runs at least
// between two restarts and only once every node holds the highest fence
// handed out, so that each restart is one fault. Every run's fence is
// distinct from every other run's, and a downstream store that keeps the
// highest fence it has taken refuses none of them out of order unless two
// leaders overlapped; the overlapping leaders are counted (Redlock with a
// node restarted empty may allow them; the fence must tell them apart).
//
// The rounds are bounded at 300ms (TimeoutFactor 0.3), not 50ms, so that
// a live node answers them on a loaded machine: a node that answers
// neither call of a fence round, besides one restarted empty, is the
// double fault fence's doc leaves, and at 50ms the race detector and a
// busy machine made it about once in thirty runs (a fence below an
// earlier run's, no two runs overlapping).
func TestSingletonChurnWithRestartedNodes(t *testing.T) {
	const instances, restarts = 4, 6
	servers, nodes := ownNodes(t, 3)
	addrs := []string{servers[0].Addr(), servers[1].Addr(), servers[2].Addr()}
	prefix := testenv.Prefix(t)
	faults := &fenceFaults{restarted: -1}
	lockers := make([]*lock.Locker, instances)
	for i := range lockers {
		clients := closing(t, lock.NewNodes(addrs...))
		for j, c := range clients {
			c.AddHook(fenceFaultHook{node: j, faults: faults})
		}
		lockers[i] = newLocker(t, clients, lock.Options{Prefix: prefix, Expiry: time.Second,
			TimeoutFactor: 0.3, Fencing: true, RetryDelay: 5 * time.Millisecond})
	}
	var (
		sec     section
		mu      sync.Mutex
		fences  = map[int64]int{}
		highest int64
		refused int // downstream writes refused: a lower fence after a higher one
		runs    atomic.Int64
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range lockers {
		job := lock.Singleton(l, "reaper", func(ctx context.Context) error {
			sec.enter()
			defer sec.exit()
			f := lock.FromContext(ctx).Fence()
			mu.Lock()
			fences[f]++
			if f > highest {
				highest = f
			} else {
				refused++
			}
			mu.Unlock()
			runs.Add(1)
			return nil
		})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := job(bg)
				if err != nil && !errors.Is(err, lock.ErrNotObtained) && !errors.Is(err, lock.ErrUnavailable) && !errors.Is(err, lock.ErrLost) {
					t.Errorf("job: %v", err)
				}
			}
		})
	}
	fenceKey := prefix + "reaper:fence"
	for i := range restarts {
		before := runs.Load()
		waitRuns(t, &runs, before+3)
		testenv.WaitFor(t, 20*time.Second, "every node holding the highest fence", func() bool {
			mu.Lock()
			h := highest
			mu.Unlock()
			for _, c := range nodes {
				if v, err := c.Get(bg, fenceKey).Int64(); err != nil || v < h {
					return false
				}
			}
			return true
		})
		s := servers[i%3]
		faults.restarting(i % 3)
		s.Kill()
		s.Restart()
	}
	waitRuns(t, &runs, runs.Load()+3)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for f, n := range fences {
		if n > 1 {
			t.Errorf("fence %d taken by %d runs", f, n)
		}
	}
	second := faults.second()
	t.Logf("%d runs, %d overlapping at most, %d fences refused downstream, %d fence calls unanswered by nodes not restarted",
		runs.Load(), sec.max.Load(), refused, second)
	if refused > 0 && sec.max.Load() < 2 {
		if second > 0 {
			// A live node missed fence calls too: with the restarted
			// one, the double fault Options.Fencing's doc leaves (numbers
			// may start again low). The run proves nothing either way.
			t.Logf("%d runs got a fence below an earlier run's, after a second fault", refused)
			return
		}
		t.Errorf("%d runs got a fence below an earlier run's though no two overlapped", refused)
	}
}

// fenceFaults counts the fence calls (the counter's GET, its raise) that
// a node other than the one last restarted did not answer: a second
// fault besides the restart.
type fenceFaults struct {
	mu        sync.Mutex
	restarted int // the node last restarted, -1 before the first
	missed    int
}

func (f *fenceFaults) restarting(node int) {
	f.mu.Lock()
	f.restarted = node
	f.mu.Unlock()
}

func (f *fenceFaults) second() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.missed
}

// fenceFaultHook reports to faults the fence calls its node's client
// sent that got no answer.
type fenceFaultHook struct {
	node   int
	faults *fenceFaults
}

func (fenceFaultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (fenceFaultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h fenceFaultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil || errors.Is(err, redis.Nil) || !isFenceCall(cmd) {
			return err
		}
		var rerr redis.Error
		if errors.As(err, &rerr) {
			return err // an answer (a refusal), not a missed call
		}
		h.faults.mu.Lock()
		if h.node != h.faults.restarted {
			h.faults.missed++
		}
		h.faults.mu.Unlock()
		return err
	}
}

// isFenceCall reports whether cmd reads or raises a fence counter.
func isFenceCall(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.HasSuffix(s, ":fence") {
			return true
		}
	}
	return false
}

// waitRuns waits until runs reaches n, for at most 20s.
func waitRuns(t *testing.T, runs *atomic.Int64, n int64) {
	t.Helper()
	testenv.WaitFor(t, 20*time.Second, fmt.Sprintf("%d runs", n), func() bool { return runs.Load() >= n })
}

// TestStoppedNodeBoundsRounds: one node of three is stopped (SIGSTOP: the
// kernel still accepts connections, nothing answers, not even go-redis's
// handshake on a new connection) before the Locker's clients ever
// connected. As New's doc promises for clients made by NewNodes, each
// round waits at most about Expiry*TimeoutFactor for it, not the client's
// ReadTimeout (3s): TryDo takes the lock on the other two quickly, and a
// Do that holds it for two Expiries keeps it, every extension dialling
// the stopped node afresh.
func TestStoppedNodeBoundsRounds(t *testing.T) {
	// Rounds of 200ms: the acquisition and the fence rounds use 600ms of
	// the 1.98s validity, which leaves a loaded machine room for the first
	// extension.
	const expiry = 2 * time.Second
	servers, nodes := ownNodes(t, 3)
	pid, err := servers[0].Client().InfoMap(bg, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(pid["Server"]["process_id"])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(p, syscall.SIGCONT) })
	l := newLocker(t, nodes, lock.Options{Expiry: expiry, TimeoutFactor: 0.1, Fencing: true})
	began := time.Now()
	err = l.TryDo(bg, "acct", func(context.Context) error { return nil })
	took := time.Since(began)
	t.Logf("TryDo with a stopped node: %v in %v", err, took)
	if err != nil {
		t.Fatalf("TryDo with one stopped node of three = %v", err)
	}
	// Four rounds (acquire, two fence rounds, release) of at most 200ms
	// each; the client's ReadTimeout would make it 12s.
	if took > 3*time.Second {
		t.Fatalf("TryDo took %v: a round waited past Expiry*TimeoutFactor for the stopped node", took)
	}
	err = l.Do(bg, "acct", func(ctx context.Context) error {
		hold := time.NewTimer(2 * expiry)
		defer hold.Stop()
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-hold.C:
			return nil
		}
	})
	if err != nil {
		t.Fatalf("Do holding the lock 2 Expiries with one stopped node = %v", err)
	}
}
