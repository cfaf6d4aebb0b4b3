package jetstreamx

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A consumer whose MaxRequestBatch is below Options.Batch, and whose
// MaxRequestExpires is below Options.MaxWait, refuses Consume's pulls as
// they are (409): Consume asks within them, so that no pull is refused
// and the messages run, those waiting and one published while it waits
// for the next.
func TestConsumeWithinConsumerRequestLimits(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{MaxRequestBatch: 4, MaxRequestExpires: 500 * time.Millisecond})
	for range 10 {
		if _, err := js.Publish(ctx, "orders.1", []byte("charge")); err != nil {
			t.Fatal(err)
		}
	}
	var runs atomic.Int32
	refusals := &refusalCounter{Handler: testenv.Logger(t).Handler()}
	h, err := New(g, func(context.Context, consumerx.Message) error { runs.Add(1); return nil },
		Options{Group: "billing", Process: consumerx.Options{Logger: slog.New(refusals)}}) // Batch 16, MaxWait 1s
	if err != nil {
		t.Fatal(err)
	}
	stop := consumeAll(t, h, cons, 1)
	defer stop()
	testenv.WaitFor(t, 10*time.Second, "the 10 messages run", func() bool { return runs.Load() == 10 })
	time.Sleep(time.Second) // Consume waits for the next message
	if _, err := js.Publish(ctx, "orders.1", []byte("charge")); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the message published later run", func() bool { return runs.Load() == 11 })
	if n := refusals.n.Load(); n != 0 {
		t.Errorf("%d pulls refused", n)
	}
}

// refusalCounter counts the logs of refused pulls.
type refusalCounter struct {
	slog.Handler
	n atomic.Int32
}

func (h *refusalCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "pull refused") {
		h.n.Add(1)
	}
	return h.Handler.Handle(ctx, r)
}
