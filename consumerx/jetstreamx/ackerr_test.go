package jetstreamx

import (
	"context"
	"errors"
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

// refusingAcks is the real consumer whose messages' acknowledgements
// never reach the server and report an error, as when the connection
// drops between a handler's end and its Ack.
type refusingAcks struct {
	jetstream.Consumer
	refused *atomic.Int32
}

var errAckRefused = errors.New("ack refused by the test")

type refusedMsg struct {
	jetstream.Msg
	refused *atomic.Int32
}

func (m refusedMsg) Ack() error                       { m.refused.Add(1); return errAckRefused }
func (m refusedMsg) Nak() error                       { m.refused.Add(1); return errAckRefused }
func (m refusedMsg) NakWithDelay(time.Duration) error { m.refused.Add(1); return errAckRefused }
func (m refusedMsg) TermWithReason(string) error      { m.refused.Add(1); return errAckRefused }

type refusedBatch struct {
	msgs chan jetstream.Msg
	err  error
}

func (b *refusedBatch) Messages() <-chan jetstream.Msg { return b.msgs }
func (b *refusedBatch) Error() error                   { return b.err }

func (c refusingAcks) wrap(b jetstream.MessageBatch, err error) (jetstream.MessageBatch, error) {
	if err != nil {
		return b, err
	}
	var in []jetstream.Msg
	for m := range b.Messages() {
		in = append(in, refusedMsg{Msg: m, refused: c.refused})
	}
	out := &refusedBatch{msgs: make(chan jetstream.Msg, len(in)), err: b.Error()}
	for _, m := range in {
		out.msgs <- m
	}
	close(out.msgs)
	return out, nil
}

func (c refusingAcks) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	return c.wrap(c.Consumer.Fetch(n, opts...))
}

func (c refusingAcks) FetchNoWait(n int) (jetstream.MessageBatch, error) {
	return c.wrap(c.Consumer.FetchNoWait(n))
}

// An acknowledgement that Consume cannot send (the connection dropped
// after the handler) is logged: the message comes back after AckWait,
// and without a word an operator cannot tell why it keeps coming back.
// Consume dropped the error.
func TestConsumeLogsAckNotSent(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	js, _ := startNATS(t)
	cons := ordersConsumer(t, js, jetstream.ConsumerConfig{AckWait: 5 * time.Second})
	if _, err := js.Publish(context.Background(), "orders.1", []byte("charge 1")); err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	var ran atomic.Int32
	h, err := New(g, func(context.Context, consumerx.Message) error { ran.Add(1); return nil },
		Options{Group: "billing", Process: consumerx.Options{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}})
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int32
	stop := consumeAll(t, h, refusingAcks{Consumer: cons, refused: &refused}, 1)
	defer stop()
	testenv.WaitFor(t, 10*time.Second, "the refused Ack logged", func() bool {
		return ran.Load() == 1 && refused.Load() >= 1 && strings.Contains(logs.String(), errAckRefused.Error())
	})
}
