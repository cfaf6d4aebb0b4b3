package watermillx

import (
	"maps"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// The messages a handler produced are published as it made them, the
// first time and on every replay, byte for byte: a UUID or a metadata
// key or value that is not valid UTF-8 (a binary header copied from a
// Kafka record: a schema id, a trace context) is not turned into U+FFFD
// on its way through the record.
func TestProducedMessagesKeptByteForByte(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	b := newBus(t)
	var outs consumertest.Outcomes
	mw, err := New(g, Options{Process: consumerx.Options{Logger: testenv.Logger(t), OnOutcome: outs.Hook}})
	if err != nil {
		t.Fatal(err)
	}
	b.router.AddMiddleware(mw.Middleware)
	const uuid = "receipt-\xff\xfe"
	meta := message.Metadata{"schema-id": "\x00\x00\x00\x2a\xc3", "trace-\xff": "span", "plain": "text"}
	b.router.AddHandler("billing", "orders", b.pubsub, "receipts", b.pubsub, func(msg *message.Message) ([]*message.Message, error) {
		r := message.NewMessage(uuid, msg.Payload)
		maps.Copy(r.Metadata, meta)
		return []*message.Message{r}, nil
	})
	receipts := b.subscribe("receipts")
	b.start()
	b.publish("orders", message.NewMessage("order-1", []byte("charge 1")))
	b.publish("orders", message.NewMessage("order-1", []byte("charge 1"))) // again: the receipts replayed
	testenv.WaitFor(t, 10*time.Second, "both deliveries' receipts", func() bool { return len(receipts()) == 2 })
	if all := outs.All(); all[consumerx.Processed] != 1 || all[consumerx.Duplicate] != 1 {
		t.Fatalf("deliveries %v; want one processed, one duplicate", all)
	}
	for i, r := range receipts() {
		got := maps.Clone(r.Metadata)
		for k := range got {
			if _, ok := meta[k]; !ok {
				delete(got, k) // the router's own (handler name, topics)
			}
		}
		if r.UUID != uuid || !maps.Equal(got, meta) {
			t.Errorf("receipt %d: UUID %q, metadata %q; want %q, %q", i, r.UUID, got, uuid, meta)
		}
	}
}

// A record written before the raw fields existed reads as it did.
func TestDecodesEarlierRecords(t *testing.T) {
	msgs, err := decode([]byte(`[{"u":"receipt-1","m":{"k":"v"},"p":"Y2hhcmdlIDE="}]`))
	if err != nil || len(msgs) != 1 || msgs[0].UUID != "receipt-1" || msgs[0].Metadata.Get("k") != "v" ||
		string(msgs[0].Payload) != "charge 1" {
		t.Fatalf("decoded %+v, %v", msgs, err)
	}
}
