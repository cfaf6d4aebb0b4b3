package lock_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// TestExclusiveWhileNodesPause: 3 processes × 4 goroutines take a fenced
// lock over and over while the nodes, one at a time, stop answering for
// a while (CLIENT PAUSE: a partition that drops packets) and come back
// with their keys. No two sections overlap, no increment of a plain
// counter is lost, and the fences, in the order the holders entered,
// only grow.
func TestExclusiveWhileNodesPause(t *testing.T) {
	const procs, perProc, rounds = 3, 4, 15
	servers, _ := ownNodes(t, 3)
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr()
	}
	// A round is bounded to 120ms (Expiry*TimeoutFactor): a node paused
	// for 150ms misses it. The Expiry is long beside the rounds an
	// acquisition takes (3 with the fence): a holder that the loaded
	// machine does not schedule for a while must not outlive its lock
	// between entering and releasing it (Do then rightly says ErrLost, and
	// the sections may overlap: Redlock's own limit, not what this test
	// is about).
	opts := lock.Options{Prefix: testenv.Prefix(t), Expiry: 2 * time.Second, TimeoutFactor: 0.06, Fencing: true, RetryDelay: 5 * time.Millisecond}
	lockers := make([]*lock.Locker, procs)
	for i := range lockers {
		lockers[i] = newLocker(t, closing(t, lock.NewNodes(addrs...)), opts)
	}
	stop := make(chan struct{})
	var chaos sync.WaitGroup
	chaos.Go(func() { // one node at a time stops answering for 150ms
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_ = servers[i%len(servers)].Client().Do(bg, "CLIENT", "PAUSE", 150, "ALL").Err()
		}
	})
	var (
		counter int // plain on purpose
		fences  []int64
		sec     section
		wg      sync.WaitGroup
	)
	// 13s on a quiet machine; the pauses leave keys behind that later
	// rounds wait out, and a loaded machine (load 15) took over a minute.
	ctx, cancel := context.WithTimeout(bg, 4*time.Minute)
	defer cancel()
	for p := range procs {
		for range perProc {
			wg.Go(func() {
				for done := 0; done < rounds; {
					err := lockers[p].Do(ctx, "pause", func(ctx context.Context) error {
						sec.enter()
						defer sec.exit()
						fences = append(fences, lock.FromContext(ctx).Fence())
						v := counter
						runtime.Gosched()
						counter = v + 1
						return nil
					})
					switch {
					case err == nil:
						done++
					case errors.Is(err, lock.ErrUnavailable) && ctx.Err() == nil:
						// a pause met a slow round: try again
					default:
						t.Errorf("Do: %v", err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(stop)
	chaos.Wait()
	if t.Failed() {
		t.FailNow()
	}
	sec.check(t)
	if want := procs * perProc * rounds; counter != want {
		t.Fatalf("counter = %d, want %d", counter, want)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence #%d is %d after %d: fences %v", i, fences[i], fences[i-1], fences)
		}
	}
	t.Logf("%d sections, last fence %d", counter, fences[len(fences)-1])
}
