package jetstreamx

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// consumeAll runs n Consume loops of h on cons until the returned stop is
// called: stop cancels their context and waits for them to return, and an
// error one returns fails the test. Calling stop again does nothing.
func consumeAll(t *testing.T, h *Handler, cons jetstream.Consumer, n int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if err := h.Consume(ctx, cons); err != nil {
				t.Errorf("Consume: %v", err)
			}
		})
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
}
