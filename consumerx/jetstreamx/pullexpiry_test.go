package jetstreamx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// A message the server delivers to a pull at the end of its wait is not
// lost: Consume's pull waits for the server to end it, not for a timer of
// its own. (Consume ended the pull's wait with a context of MaxWait,
// which nats.go turns into a server expiry of 90% of it: a message sent
// in the last tenth, or late because the machine was loaded, arrived
// after the client had stopped listening and came back only after
// AckWait, 30 s. Seen as TestStoreOutageDoesNotUseUpMaxDeliver's run
// taking 30.7 s of 31 under CPU burners: one failed delivery, then
// nothing until AckWait.) Here every message is published while Consume
// waits in pulls of 5 ms; each must run within a few seconds, far less
// than AckWait.
func TestMessageAtPullExpiryNotLost(t *testing.T) {
	const n = 100
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{AckWait: 30 * time.Second})
	ran := make(chan string, n)
	var outs consumertest.Outcomes
	h, err := New(g, func(_ context.Context, msg consumerx.Message) error { ran <- msg.ID; return nil },
		Options{Group: "billing", MaxWait: 5 * time.Millisecond, Process: consumerx.Options{OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	stop := consumeAll(t, h, cons, 1)
	defer stop()
	lost := 0
	for i := range n {
		if _, err := js.Publish(ctx, fmt.Sprintf("orders.%d", i), []byte("charge")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ran:
		case <-time.After(5 * time.Second):
			lost++
			t.Errorf("message %d not run within 5s (AckWait 30s): lost at a pull's expiry?", i)
			if lost == 3 {
				t.Fatalf("%d of %d messages lost; outcomes %v", lost, i+1, outs.All())
			}
		}
	}
}
