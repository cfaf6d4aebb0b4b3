package jetstreamx

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// countingBilling creates the stream name (subjects orders.>), its
// consumer "billing", and a Handler of the consumer whose function counts
// the runs of each payload in ran and whose dead letters it counts in dead.
func countingBilling(t *testing.T, js jetstream.JetStream, name string) (cons jetstream.Consumer, h *Handler, ran map[string]int, dead *int) {
	t.Helper()
	g, _, _ := consumertest.Guard(t, guard.Options{})
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"orders.>"}})
	if err != nil {
		t.Fatal(err)
	}
	cons, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	ran, dead = map[string]int{}, new(int)
	h, err = New(g, func(_ context.Context, msg consumerx.Message) error { ran[string(msg.Payload)]++; return nil },
		Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t),
			DeadLetter: func(context.Context, consumerx.Message, error) error { *dead++; return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	return cons, h, ran, dead
}

// fetch fetches up to n messages of cons, waiting at most 5 seconds.
func fetch(t *testing.T, cons jetstream.Consumer, n int) []jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	return msgs
}

// A JetStream stream name may be 255 characters long, so
// "<stream>:<sequence>" can be longer than guard.MaxIDLen. A message of
// such a stream, without a Nats-Msg-Id, still gets a usable key of its
// own and runs once (it is not dead-lettered as a bad id).
func TestLongStreamNameMessagesHaveUsableKeys(t *testing.T) {
	js, _ := startNATS(t)
	ctx := context.Background()
	cons, h, ran, dead := countingBilling(t, js, strings.Repeat("S", 255))
	for _, p := range []string{"charge 1", "charge 2"} {
		if _, err := js.Publish(ctx, "orders.1", []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	outs, err := h.HandleBatch(ctx, fetch(t, cons, 2))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		if o != consumerx.Processed {
			t.Errorf("message %d: %s; want processed", i, o)
		}
	}
	if *dead != 0 || len(ran) != 2 || ran["charge 1"] != 1 || ran["charge 2"] != 1 {
		t.Errorf("ran %v, dead-lettered %d; want each once, none", ran, *dead)
	}
}

// A publisher's Nats-Msg-Id may be longer than guard.MaxIDLen, or hold a
// control character (a tab): such a message still gets a usable key of
// its own, runs once, and is a duplicate when it comes back; it is not
// dead-lettered as a bad id. (It was: the money message never ran.) Two
// long ids that differ only past the first 255 bytes are two messages.
func TestUnusableMsgIDMessagesHaveUsableKeys(t *testing.T) {
	js, _ := startNATS(t)
	ctx := context.Background()
	cons, h, ran, dead := countingBilling(t, js, "ORDERS")
	long := strings.Repeat("tenant-7/order/", 20) // 300 bytes
	ids := []string{long + "a", long + "b", "order\t9"}
	for i, id := range ids {
		if _, err := js.Publish(ctx, "orders.1", []byte(fmt.Sprint("charge ", i)), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	msgs := fetch(t, cons, len(ids))
	if len(msgs) != len(ids) {
		t.Fatalf("fetched %d messages, want %d", len(msgs), len(ids))
	}
	for round, want := range []consumerx.Outcome{consumerx.Processed, consumerx.Duplicate} {
		outs, err := h.HandleBatch(ctx, msgs)
		if err != nil && round == 0 {
			t.Fatal(err)
		}
		for i, o := range outs {
			if o != want {
				t.Errorf("round %d, message %d: %s; want %s", round, i, o, want)
			}
		}
	}
	if *dead != 0 || len(ran) != len(ids) {
		t.Errorf("ran %v, dead-lettered %d; want each once, none", ran, *dead)
	}
	for p, n := range ran {
		if n != 1 {
			t.Errorf("%s ran %d times", p, n)
		}
	}
}
