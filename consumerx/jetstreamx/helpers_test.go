package jetstreamx

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
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

// publishHeldByDead publishes message order-1 ("charge 1") after dead, a
// consumer that then died, claimed its key (h's key and default
// fingerprint): its lease must run out before h can run it.
func publishHeldByDead(t *testing.T, js jetstream.JetStream, h *Handler, dead *guard.Guard) {
	t.Helper()
	ctx := context.Background()
	payload := []byte("charge 1")
	key, err := h.Processor().Key(consumerx.Message{ID: "order-1"})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(payload) // the default fingerprint
	if c, err := dead.Claim(ctx, key, base64.RawURLEncoding.EncodeToString(sum[:])); err != nil || c.Status != guard.Acquired {
		t.Fatalf("the dead consumer's claim: %+v, %v", c, err)
	}
	if _, err := js.Publish(ctx, "orders.1", payload, jetstream.WithMsgID("order-1")); err != nil {
		t.Fatal(err)
	}
}
