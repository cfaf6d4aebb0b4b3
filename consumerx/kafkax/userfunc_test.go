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

// A key function that panics for one record does not take Run down: the
// record is dead-lettered once (ErrNoKey, ErrPanicked) in its place, and
// the records around it run, in order, and are committed.
func TestPanickingKeyFunctionDeadLettersItsRecord(t *testing.T) {
	g, _, _ := consumertest.Guard(t, guard.Options{})
	addrs, producer, _ := startKafka(t, "orders")
	ctx := context.Background()
	for _, v := range []string{"charge 1", "poison", "charge 2"} {
		if err := producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("customer-1"), Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cl := groupClient(t, addrs, "billing", "orders")
	defer cl.CloseAllowingRebalance()
	var order []string // the partition's goroutine only
	var cause error
	c, err := New(cl, g, func(_ context.Context, msg consumerx.Message) error {
		order = append(order, string(msg.Payload))
		return nil
	}, Options{RetryDelay: 5 * time.Millisecond, Process: consumerx.Options{Logger: testenv.Logger(t),
		Key: func(msg consumerx.Message) (string, error) {
			if string(msg.Payload) == "poison" {
				panic("a key function that does not expect this payload")
			}
			return msg.ID, nil
		},
		DeadLetter: func(_ context.Context, msg consumerx.Message, c error) error {
			order, cause = append(order, "dead "+string(msg.Payload)), c
			return nil
		}}})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	testenv.WaitFor(t, 20*time.Second, "the records committed", func() bool { return lag(t, producer, "billing", "orders") == 0 })
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(order) != "[charge 1 dead poison charge 2]" || !errors.Is(cause, consumerx.ErrNoKey) || !errors.Is(cause, guard.ErrPanicked) {
		t.Errorf("in order: %v, cause %v; want [charge 1 dead poison charge 2], ErrNoKey and ErrPanicked", order, cause)
	}
}
