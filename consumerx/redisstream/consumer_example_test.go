package redisstream_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/redisstream"
	"github.com/idemguard/idemguard/guard"
)

// Two entries carry the same order: the charge runs once. The three
// entries come in one batch: their handlers run first, then the outcomes
// are known (the batch's completions are one round trip).
func ExampleConsumer_Run() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()

	for _, order := range []string{"order-1", "order-2", "order-1"} {
		rdb.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: []any{"order", order, "payload", "charge " + order}})
	}

	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})
	seen := 0
	c, err := redisstream.New(rdb, g, func(ctx context.Context, msg consumerx.Message) error {
		fmt.Println(string(msg.Payload))
		return nil
	}, redisstream.Options{
		Stream: "orders", Group: "billing", Consumer: "worker-1", Block: 50 * time.Millisecond,
		Process: consumerx.Options{
			// The producer's order id, not the entry id, names the message.
			Key:    func(msg consumerx.Message) (string, error) { return msg.Metadata["order"], nil },
			Logger: slog.New(slog.DiscardHandler),
			OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
				fmt.Println(msg.Metadata["order"], o)
				if seen++; seen == 3 {
					stop()
				}
			},
		},
	})
	if err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
	// Output:
	// charge order-1
	// charge order-2
	// order-1 processed
	// order-2 processed
	// order-1 duplicate
}
