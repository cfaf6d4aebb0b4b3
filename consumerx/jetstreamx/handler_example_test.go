package jetstreamx_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/jetstreamx"
	"github.com/idemguard/idemguard/guard"
)

// An order published twice, with the same Nats-Msg-Id but after the
// stream's duplicate window: JetStream stores both, the charge runs once.
func ExampleHandler_Consume() {
	dir, _ := os.MkdirTemp("", "jetstreamx-example")
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	ns.Start()
	defer ns.WaitForShutdown()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		panic("nats-server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}, Duplicates: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		panic(err)
	}
	// The same order twice, past the stream's duplicate window, so that
	// both are delivered: a window the server has not yet purged (a
	// loaded machine) answers the second as a duplicate, and it is sent
	// again.
	for sent := 0; sent < 2; {
		ack, err := js.Publish(ctx, "orders.new", []byte("order-1"), jetstream.WithMsgID("order-1"))
		if err != nil {
			panic(err)
		}
		if !ack.Duplicate {
			sent++
		}
		time.Sleep(200 * time.Millisecond) // let the duplicate window pass
	}

	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	seen := 0
	h, err := jetstreamx.New(g, func(ctx context.Context, msg consumerx.Message) error {
		fmt.Printf("charging %s\n", msg.Payload)
		return nil
	}, jetstreamx.Options{Group: "billing", Process: consumerx.Options{
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
	if err := h.Consume(ctx, cons); err != nil {
		panic(err)
	}
	// Output:
	// charging order-1
	// order-1 processed
	// order-1 duplicate
}

// A fetched batch run and acknowledged together: the claims of the batch
// are one round trip, the completions another; the messages are reported
// in progress every InProgressEvery until they are acknowledged.
func ExampleHandler_HandleBatch() {
	dir, _ := os.MkdirTemp("", "jetstreamx-example")
	defer os.RemoveAll(dir)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	ns.Start()
	defer ns.WaitForShutdown()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		panic("nats-server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		panic(err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		panic(err)
	}
	for _, o := range []string{"order-1", "order-2", "order-1"} {
		if _, err := js.Publish(ctx, "orders.new", []byte(o)); err != nil {
			panic(err)
		}
	}

	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})
	h, err := jetstreamx.New(g, func(ctx context.Context, msg consumerx.Message) error {
		fmt.Printf("charging %s\n", msg.Payload)
		return nil
	}, jetstreamx.Options{Group: "billing", InProgressEvery: 10 * time.Second, Process: consumerx.Options{
		Key:    func(msg consumerx.Message) (string, error) { return string(msg.Payload), nil }, // the order names the message
		Logger: slog.New(slog.DiscardHandler),
	}})
	if err != nil {
		panic(err)
	}
	batch, err := cons.Fetch(3, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		panic(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	outs, err := h.HandleBatch(ctx, msgs)
	fmt.Println(outs, err)
	// Output:
	// charging order-1
	// charging order-2
	// [processed processed duplicate] <nil>
}
