package kafkax

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/internal/consumertest"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

// A record whose handler always panics is a poison pill: Kafka has no
// per-record nack, so it is retried in place and holds back its
// partition. Each panic counts as a failed attempt: after MaxAttempts the
// record is dead-lettered (the cause matches guard.ErrExhausted and
// guard.ErrPanicked) and the records behind it run, in order.
func TestPanickingRecordDeadLetteredAfterMaxAttempts(t *testing.T) {
	const maxAttempts = 3
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	// One record key, so one partition: the poison pill, then a good record.
	for _, v := range []string{"poison", "charge 2"} {
		if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("customer-1"), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var order []string // the partition's goroutine only
	var cause error
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		if string(msg.Payload) == "poison" {
			order = append(order, "panic")
			panic("nil map")
		}
		order = append(order, "ok")
		return nil
	}, Options{RetryDelay: 5 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t), MaxAttempts: maxAttempts,
		DeadLetter: func(_ context.Context, _ consumerx.Message, c error) error {
			order, cause = append(order, "dead"), c
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "both records committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(order) != "[panic panic panic dead ok]" {
		t.Errorf("in order: %v; want [panic panic panic dead ok]", order)
	}
	var pe *guard.PanicError
	if !errors.Is(cause, guard.ErrExhausted) || !errors.As(cause, &pe) || pe.Value != "nil map" {
		t.Errorf("dead-letter cause %v; want exhausted, with the panic", cause)
	}
}
