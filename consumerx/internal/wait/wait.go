// Package wait is the pause the consumer adapters take between tries.
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
