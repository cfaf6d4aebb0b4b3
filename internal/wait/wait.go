// Package wait is a pause that ends early with its context: the consumer
// adapters take it between tries, the demo's effects and the proof drills
// for their work.
package wait

import (
	"context"
	"time"
)

// For waits d, or less if ctx ends first; it reports whether ctx is still
// live (false: stop, do not try again).
func For(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
