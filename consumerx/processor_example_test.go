package consumerx_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/guard"
)

// A broker delivers the same message twice: the charge runs once, the
// second delivery is acknowledged as a duplicate.
func ExampleWrap() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	charge, err := consumerx.Wrap(g, "billing", func(ctx context.Context, msg consumerx.Message) error {
		fmt.Printf("charging %s\n", msg.Payload)
		return nil
	}, consumerx.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}

	msg := consumerx.Message{ID: "evt_1", Payload: []byte("order-1: 10 EUR")}
	for range 2 {
		outcome, err := charge(context.Background(), msg)
		fmt.Println(outcome, "ack:", outcome.Ack(), err)
	}
	// Output:
	// charging order-1: 10 EUR
	// processed ack: true <nil>
	// duplicate ack: true <nil>
}

// A handler that keeps failing is retried until MaxAttempts, then handed
// to the dead letter with its last error and acknowledged.
func ExampleProcessor_Process() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	p, err := consumerx.NewProcessor(g, "billing", consumerx.Options{
		MaxAttempts: 2,
		DeadLetter: func(ctx context.Context, msg consumerx.Message, cause error) error {
			var exh *guard.ExhaustedError
			if errors.As(cause, &exh) {
				fmt.Printf("dead letter %s after %d attempts: %s\n", msg.ID, exh.Attempts, exh.LastError)
			}
			return nil
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	msg := consumerx.Message{ID: "evt_2", Payload: []byte("order-2")}
	for range 3 {
		outcome, _ := p.Process(context.Background(), msg, func(ctx context.Context, msg consumerx.Message) error {
			lease, _ := consumerx.LeaseFrom(ctx)
			return fmt.Errorf("card declined (attempt %d)", lease.Attempt)
		})
		fmt.Println(outcome)
	}
	// Output:
	// failed
	// dead letter evt_2 after 2 attempts: card declined (attempt 2)
	// dead_lettered
	// dead_lettered
}

// A batch of deliveries, as a broker hands them over: one message is a
// redelivery of one already processed, one fails. The batch's claims and
// completions are one round trip each.
func ExampleProcessor_ProcessBatch() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})
	p, err := consumerx.NewProcessor(g, "billing", consumerx.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	charge := func(ctx context.Context, msg consumerx.Message) error {
		if msg.ID == "evt_3" {
			return errors.New("card declined")
		}
		fmt.Printf("charging %s\n", msg.Payload)
		return nil
	}
	ctx := context.Background()
	p.Process(ctx, consumerx.Message{ID: "evt_1", Payload: []byte("order-1")}, charge)

	batch := []consumerx.Message{
		{ID: "evt_1", Payload: []byte("order-1")},
		{ID: "evt_2", Payload: []byte("order-2")},
		{ID: "evt_3", Payload: []byte("order-3")},
	}
	for i, r := range p.ProcessBatch(ctx, batch, charge, consumerx.BatchOptions{}) {
		fmt.Println(batch[i].ID, r.Outcome, "ack:", r.Outcome.Ack())
	}
	// Output:
	// charging order-1
	// charging order-2
	// evt_1 duplicate ack: true
	// evt_2 processed ack: true
	// evt_3 failed ack: false
}
