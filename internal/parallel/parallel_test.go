package parallel_test

import (
	"errors"
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

// A call that panics on one of Each's goroutines reaches the caller as a
// panic it can recover (it ended the process), after the calls under way
// have returned, and no further call starts.
func TestEachPanicReachesCaller(t *testing.T) {
	defer goleak.VerifyNone(t)
	boom := errors.New("boom")
	for _, limit := range []int{1, 4} {
		var calls atomic.Int32
		got := func() (p any) {
			defer func() { p = recover() }()
			parallel.Each(100, limit, func(i int) {
				calls.Add(1)
				if i == 0 {
					panic(boom)
				}
			})
			return nil
		}()
		pe, ok := got.(*parallel.PanicError)
		if !ok {
			t.Fatalf("limit %d: Each panicked with %#v, want a *parallel.PanicError", limit, got)
		}
		if !errors.Is(pe, boom) || len(pe.Stack) == 0 {
			t.Errorf("limit %d: PanicError %v: want the call's error and its stack", limit, pe)
		}
		// One at a time, nothing starts after the call that panicked.
		if n := calls.Load(); limit == 1 && n != 1 {
			t.Errorf("limit 1: %d calls, want 1: none after the one that panicked", n)
		}
	}
}

// runtime.Goexit in a call is reported to the caller too, not lost.
func TestEachGoexitReachesCaller(t *testing.T) {
	defer goleak.VerifyNone(t)
	got := func() (p any) {
		defer func() { p = recover() }()
		parallel.Each(8, 4, func(i int) {
			if i == 2 {
				runtime.Goexit()
			}
		})
		return nil
	}()
	if _, ok := got.(*parallel.PanicError); !ok {
		t.Fatalf("Each after a Goexit: %#v, want a *parallel.PanicError", got)
	}
}
