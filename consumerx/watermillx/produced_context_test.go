package watermillx

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

type rev22TraceKey struct{}

// A handler that hands its produced message a context (a trace span, as
// watermill-opentelemetry's publisher decorator reads from
// msg.Context(), or any value a publisher decorator needs) has it
// published with that context without the middleware. Through the
// middleware, the run that processed the message returns copies decoded
// from the stored record, with a bare context: the values are gone for
// the first (and only real) publish, not only for a duplicate's replay.
func TestProducedMessageKeepsHandlerContext(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	mw, err := New(g, Options{Group: "billing", Process: consumerx.Options{Logger: testenv.Logger(t)}})
	if err != nil {
		t.Fatal(err)
	}
	h := func(msg *message.Message) ([]*message.Message, error) {
		out := message.NewMessage("receipt-"+msg.UUID, []byte("receipt"))
		out.SetContext(context.WithValue(msg.Context(), rev22TraceKey{}, "span-1"))
		return []*message.Message{out}, nil
	}
	in := message.NewMessage(watermill.NewUUID(), []byte("order 1"))
	bare, _ := h(in)
	if bare[0].Context().Value(rev22TraceKey{}) != "span-1" {
		t.Fatal("setup: the handler's context value is not on its own message")
	}
	produced, err := mw.Middleware(h)(message.NewMessage(watermill.NewUUID(), []byte("order 2")))
	if err != nil || len(produced) != 1 {
		t.Fatalf("produced %d, %v", len(produced), err)
	}
	if v := produced[0].Context().Value(rev22TraceKey{}); v != "span-1" {
		t.Errorf("the processed run's produced message has context value %v, want the handler's %q", v, "span-1")
	}
	if err := produced[0].Context().Err(); err != nil {
		t.Errorf("the produced message's context has ended (%v) before the router publishes it", err)
	}
}
