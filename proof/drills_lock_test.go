package proof

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/lock"
)

// holders tracks who is inside the critical section of a lock.
type holders struct {
	mu       sync.Mutex
	active   map[int64]context.Context // fence -> the holder's context
	maxFence int64
	entries  int
	overlaps []string // a holder entered while another's context was live
	regress  []string // a holder's fence was not above every earlier one
}

func (h *holders) enter(ctx context.Context, fence int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries++
	for f, other := range h.active {
		if other.Err() == nil {
			h.overlaps = append(h.overlaps, fmt.Sprintf("fence %d entered while %d held", fence, f))
		}
	}
	if fence <= h.maxFence {
		h.regress = append(h.regress, fmt.Sprintf("fence %d after %d", fence, h.maxFence))
	}
	h.maxFence = max(h.maxFence, fence)
	h.active[fence] = ctx
}

func (h *holders) exit(fence int64) {
	h.mu.Lock()
	delete(h.active, fence)
	h.mu.Unlock()
}

// lockDrill runs two Lockers (two processes' worth of clients) over three
// Redis nodes of the test's own, four goroutines per Locker taking lock
// "job" with Do in a loop, while fault runs; it returns the tally. Every
// Do holds rounds for reading: fault takes it to act while none is under
// way.
func lockDrill(t *testing.T, expiry time.Duration, run time.Duration, fault func(servers []*testenv.Server, rounds *sync.RWMutex)) *holders {
	t.Helper()
	servers := make([]*testenv.Server, 3)
	addrs := make([]string, 3)
	for i := range servers {
		servers[i] = testenv.StartRedis(t)
		addrs[i] = servers[i].Addr()
	}
	h := &holders{active: map[int64]context.Context{}}
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var (
		wg     sync.WaitGroup
		errs   sync.Map
		rounds sync.RWMutex
	)
	for range 2 {
		nodes := lock.NewNodes(addrs...)
		t.Cleanup(func() {
			for _, n := range nodes {
				_ = n.(*redis.Client).Close()
			}
		})
		l, err := lock.New(nodes, lock.Options{Expiry: expiry, Fencing: true, RetryDelay: 10 * time.Millisecond, UnavailableTries: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			wg.Go(func() {
				for ctx.Err() == nil {
					rounds.RLock()
					err := l.Do(ctx, "job", func(ctx context.Context) error {
						fence := lock.FromContext(ctx).Fence()
						h.enter(ctx, fence)
						defer h.exit(fence)
						select { // the job: a little work, stopped when the lock is lost
						case <-time.After(expiry / 10):
						case <-ctx.Done():
						}
						return nil
					})
					rounds.RUnlock()
					if err != nil {
						kind := "other"
						switch {
						case errors.Is(err, lock.ErrLost):
							kind = "lost"
						case errors.Is(err, lock.ErrUnavailable):
							kind = "unavailable"
						case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
							kind = "ctx"
						}
						n, _ := errs.LoadOrStore(kind, new(atomic.Int64))
						n.(*atomic.Int64).Add(1)
					}
				}
			})
		}
	}
	fault(servers, &rounds)
	wg.Wait()
	var tally []string
	errs.Range(func(k, v any) bool {
		tally = append(tally, fmt.Sprintf("%s:%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("%d acquisitions, highest fence %d, overlapping live holders %d, fence regressions %d, Do errors %v",
		h.entries, h.maxFence, len(h.overlaps), len(h.regress), tally)
	return h
}

// One node at a time is killed and restarted empty at once (no
// persistence, back within the expiry, as the package doc warns against).
// Two holders at once may then happen (documented); fences must still
// grow, so a fenced store rejects the older holder.
//
// One fault at a time: a node is restarted only while its counter is as
// high as the others', and only once a round has raised the last restarted
// node's again (it came back empty). A node behind the others is a fault
// of its own: it missed both calls of a round (a 25 ms timeout on a loaded
// machine), and restarting another node empty then leaves the last number
// on one node only, which a quorum of reads can miss (lock/fence.go). The
// kill waits for no round to be under way, so none can leave a node behind
// between the check and the kill. Waiting for the repair alone, a slow run
// handed out 29 twice (fence regressions [28 after 29, 29 after 29]), and
// CI failed the drill again.
func TestDrillLockNodeRestartedEmpty(t *testing.T) {
	const expiry = 500 * time.Millisecond
	h := lockDrill(t, expiry, 6*time.Second, func(servers []*testenv.Server, rounds *sync.RWMutex) {
		clients := make([]*redis.Client, len(servers))
		for i, srv := range servers {
			clients[i] = srv.Client()
		}
		fence := func(c *redis.Client) int64 {
			n, err := c.Get(context.Background(), lock.DefaultPrefix+"job:fence").Int64()
			if err != nil {
				return -1 // none yet, or the node is down
			}
			return n
		}
		for i := range 6 {
			time.Sleep(expiry / 2)
			srv := servers[i%3]
			testenv.WaitFor(t, 30*time.Second, "the three nodes' fence counters to agree, no round under way", func() bool {
				rounds.Lock()
				if f := fence(clients[0]); f > 0 && fence(clients[1]) == f && fence(clients[2]) == f {
					return true // still locked: no round runs until the node is back
				}
				rounds.Unlock()
				return false
			})
			srv.Kill()
			srv.Restart()
			rounds.Unlock()
			testenv.WaitFor(t, 30*time.Second, "a round to repair the restarted node's fence counter", func() bool {
				return fence(clients[i%3]) > 0
			})
		}
	})
	if len(h.regress) > 0 {
		t.Errorf("fence regressions %v", h.regress)
	}
	if len(h.overlaps) > 0 {
		t.Logf("overlapping holders (documented for a node restarted empty within the expiry): %v", h.overlaps)
	}
}
