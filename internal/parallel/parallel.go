// Package parallel runs the calls of a batch a bounded number at a time:
// guard's per-key batches over a store without batch calls, and the
// backstop's per-key checks of a batch.
package parallel

import "sync"

// Each calls f(0) … f(n-1), at most limit at once (at least one), and
// returns when every call has returned. Each f(i) should write only what
// belongs to i. A single call runs on the caller's goroutine.
func Each(n, limit int, f func(i int)) {
	if n == 1 {
		f(0)
		return
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		next int
	)
	for range min(n, max(limit, 1)) {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}
