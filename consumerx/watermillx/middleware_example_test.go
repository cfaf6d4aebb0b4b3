package watermillx_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/watermillx"
	"github.com/idemguard/idemguard/guard"
)

// The same message published twice: the handler runs once.
func ExampleMiddleware_Middleware() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	pubsub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	handled := make(chan struct{})
	dedup, err := watermillx.New(g, watermillx.Options{Process: consumerx.Options{
		Logger: slog.New(slog.DiscardHandler),
		OnOutcome: func(_ context.Context, msg consumerx.Message, o consumerx.Outcome, _ error) {
			fmt.Println(msg.ID, o)
			handled <- struct{}{}
		},
	}})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(dedup.Middleware)
	router.AddConsumerHandler("billing", "orders", pubsub, func(msg *message.Message) error {
		fmt.Printf("charging %s\n", msg.Payload)
		return nil
	})
	go func() { _ = router.Run(context.Background()) }()
	<-router.Running()

	for range 2 { // the same message, delivered twice
		_ = pubsub.Publish("orders", message.NewMessage("msg-1", []byte("order-1")))
		<-handled
	}
	_ = router.Close()
	_ = pubsub.Close()
	// Output:
	// charging order-1
	// msg-1 processed
	// msg-1 duplicate
}
