package kafkax_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/kafkax"
	"github.com/idemguard/idemguard/guard"
)

// A record produced twice with the same key: the charge runs once.
func ExampleConsumer_Run() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	for range 2 {
		producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("order-1"), Value: []byte("charge 10 EUR")})
	}

	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("orders"),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(),
		// A rebalance waiting for a poll stops it (a record retried in
		// place, a handler that runs long), instead of holding the group.
		kafkax.OnPartitionsCallbackBlocked(nil),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer client.CloseAllowingRebalance()
	seen := 0
	c, err := kafkax.New(client, g, func(ctx context.Context, msg consumerx.Message) error {
		fmt.Printf("%s\n", msg.Payload)
		return nil
	}, kafkax.Options{Process: consumerx.Options{
		// The record key names the order; the default id (topic/partition/
		// offset) only catches records fetched again.
		Key:    func(msg consumerx.Message) (string, error) { return string(msg.Raw.(*kgo.Record).Key), nil },
		Logger: slog.New(slog.DiscardHandler),
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
			fmt.Println(msg.ID, o)
			if seen++; seen == 2 {
				stop()
			}
		},
	}})
	if err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
	// Output:
	// charge 10 EUR
	// orders/0/0 processed
	// orders/0/1 duplicate
}
