package consumerx_test

import (
	"context"
	"testing"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
)

// An ordered batch stops at a message Interrupted by the consumer's
// shutdown; a later message whose claim answered a mismatch is not
// acknowledged and gets no dead letter past the stop: it is Interrupted,
// as the shutdown left it. (It was settled, and with no DeadLetter set
// came back DeadLettered: acknowledged past the stop.)
func TestOrderedNoDeadLetterPastAShutdownStop(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	bg := context.Background()
	msgs := batchOf(2)
	ok := func(context.Context, consumerx.Message) error { return nil }
	p := newProcessor(t, g, "billing", consumerx.Options{})
	// m1 ran before with another payload: its claim answers a mismatch.
	if o, err := p.Process(bg, consumerx.Message{ID: "m1", Payload: []byte("another order")}, ok); o != consumerx.Processed {
		t.Fatalf("m1's first copy: %s, %v", o, err)
	}
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	h := func(hctx context.Context, msg consumerx.Message) error {
		if msg.ID == "m0" {
			cancel() // the consumer shuts down while m0 runs
			<-hctx.Done()
			return hctx.Err()
		}
		return nil
	}
	res := p.ProcessBatch(ctx, msgs, h, consumerx.BatchOptions{Ordered: true})
	if res[0].Outcome != consumerx.Interrupted {
		t.Fatalf("m0: %s, %v; want interrupted", res[0].Outcome, res[0].Err)
	}
	if res[1].Outcome != consumerx.Interrupted {
		t.Fatalf("m1, past the stop at m0: %s, %v; want interrupted, not acknowledged", res[1].Outcome, res[1].Err)
	}
}
