// Package parallel runs the calls of a batch a bounded number at a time:
// guard's per-key batches over a store without batch calls, and the
// backstop's per-key checks of a batch.
package parallel

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
)

// Each calls f(0) … f(n-1), at most limit at once (at least one), and
// returns when every call has returned. Each f(i) should write only what
// belongs to i. A single call runs on the caller's goroutine.
//
// A call that panics stops Each from starting further calls; once the
// calls under way have returned, Each panics on the caller's goroutine
// with a *PanicError holding the first panic's value and stack, so a
// caller can recover it as it would a panic of its own goroutine (a panic
// on a goroutine of Each's would end the process).
func Each(n, limit int, f func(i int)) {
	if n == 1 {
		f(0)
		return
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		next     int
		panicked *PanicError
	)
	call := func(i int) (ok bool) {
		defer func() {
			if ok {
				return
			}
			// f panicked, or called runtime.Goexit (recover returns
			// nil; the goroutine ends as asked, and the caller is told
			// rather than left with a call that never finished).
			p := recover()
			if p == nil {
				p = errGoexit
			}
			mu.Lock()
			if panicked == nil {
				panicked = &PanicError{Value: p, Stack: debug.Stack()}
			}
			mu.Unlock()
		}()
		f(i)
		return true
	}
	for range min(n, max(limit, 1)) {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := panicked != nil
				mu.Unlock()
				if i >= n || stop {
					return
				}
				if !call(i) {
					return
				}
			}
		})
	}
	wg.Wait()
	if panicked != nil {
		panic(panicked)
	}
}

var errGoexit = errors.New("parallel: a call ended its goroutine with runtime.Goexit")

// PanicError is what Each panics with when one of its calls panicked.
type PanicError struct {
	Value any    // what the call panicked with
	Stack []byte // the panicking goroutine's stack
}

// Error reports the call's panic value and its stack.
func (p *PanicError) Error() string {
	return fmt.Sprintf("%v\n\n%s", p.Value, p.Stack)
}

// Unwrap returns the panic's value if it is an error.
func (p *PanicError) Unwrap() error {
	err, _ := p.Value.(error)
	return err
}
