package parallel_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/internal/parallel"
)

// Every index is called once, never more than limit at once, and Each
// returns only when every call has: no goroutine is left behind.
func TestEach(t *testing.T) {
	defer goleak.VerifyNone(t)
	for _, tc := range []struct{ n, limit int }{{0, 4}, {1, 4}, {3, 4}, {50, 4}, {50, 1}, {7, 0}} {
		var (
			mu            sync.Mutex
			calls         = make([]int, tc.n)
			running, peak atomic.Int32
			release       = make(chan struct{})
			started       atomic.Int32
		)
		want := int32(min(tc.n, max(tc.limit, 1)))
		go func() {
			// Hold the first calls until as many run as may: the peak is
			// then reached whatever the scheduler does.
			for started.Load() < want {
				runtime.Gosched()
			}
			close(release)
		}()
		parallel.Each(tc.n, tc.limit, func(i int) {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			started.Add(1)
			<-release
			mu.Lock()
			calls[i]++
			mu.Unlock()
			running.Add(-1)
		})
		if tc.n == 0 {
			<-release
		}
		for i, c := range calls {
			if c != 1 {
				t.Errorf("n %d, limit %d: f(%d) called %d times", tc.n, tc.limit, i, c)
			}
		}
		if tc.n > 0 && peak.Load() != want {
			t.Errorf("n %d, limit %d: %d calls at once at most, want %d", tc.n, tc.limit, peak.Load(), want)
		}
	}
}
