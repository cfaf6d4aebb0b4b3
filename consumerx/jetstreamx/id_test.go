package jetstreamx

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A JetStream stream name may be 255 characters long, so
// "<stream>:<sequence>" can be longer than guard.MaxIDLen. A message of
// such a stream, without a Nats-Msg-Id, still gets a usable key of its
// own and runs once (it is not dead-lettered as a bad id).
func TestLongStreamNameMessagesHaveUsableKeys(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	ctx := context.Background()
	name := strings.Repeat("S", 255)
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var dead int
	ran := map[string]int{}
	h, err := New(g, func(_ context.Context, msg consumerx.Message) error { ran[string(msg.Payload)]++; return nil },
		Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t),
			DeadLetter: func(context.Context, consumerx.Message, error) error { dead++; return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"charge 1", "charge 2"} {
		if _, err := js.Publish(ctx, "orders.1", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	outs, err := h.HandleBatch(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o != consumerx.Processed {
			t.Errorf("message %d: %s; want processed", i, o)
		}
	}
	if dead != 0 || len(ran) != 2 || ran["charge 1"] != 1 || ran["charge 2"] != 1 {
		t.Errorf("ran %v, dead-lettered %d; want each once, none", ran, dead)
	}
}
