package redisstream_test

// The README's Redis Streams snippet, verbatim (TestSnippetsInTests in internal/testenv checks
// that it still is), run.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/consumerx"
	"github.com/idemguard/idemguard/consumerx/redisstream"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/internal/testenv"
)

func readmeRedisStream(ctx context.Context, client redis.UniversalClient, g *guard.Guard,
	ship func(ctx context.Context, payload []byte) error, hostname string) error {
	c, err := redisstream.New(client, g, func(ctx context.Context, msg consumerx.Message) error {
		return ship(ctx, msg.Payload) // once per message, however often it is delivered; an error is retried
	}, redisstream.Options{
		Stream: "orders", Group: "shipping", Consumer: hostname, // one Consumer name per running process
		Process: consumerx.Options{
			// The producer's id, when it may XADD one message twice; without it, the stream and
			// entry id (redisstream.ID: "orders/1700000000000-0").
			Key: func(msg consumerx.Message) (string, error) { return msg.Metadata["order_id"], nil },
		},
	})
	if err != nil {
		return err
	}
	return c.Run(ctx) // until ctx ends (or its client is closed: an error matching redis.ErrClosed)
}

// TestReadmeRedisStream runs the snippet on an embedded Redis (its stream
// is "orders", which tests on the shared Redis may use too): one order
// XADDed twice ships once, an entry without order_id goes to orders:dead.
func TestReadmeRedisStream(t *testing.T) {
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, order := range []string{"order-1", "order-1", ""} {
		values := []any{"payload", "ship " + order}
		if order != "" {
			values = append(values, "order_id", order)
		}
		if err := client.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	var shipped atomic.Int64
	ship := func(ctx context.Context, payload []byte) error { shipped.Add(1); return nil }
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}), guard.Options{})
	done := make(chan error, 1)
	go func() { done <- readmeRedisStream(ctx, client, g, ship, "worker-1") }()

	// The three entries are one batch (Count 16), acknowledged together.
	// The dead letter is read first: it is sent after the batch was read,
	// so nothing pending after it means the batch was acknowledged (read
	// the other way round, an XPENDING before the read and an XLEN after
	// the dead letter ended the wait with the handler still running).
	testenv.WaitFor(t, 10*time.Second, "the batch acknowledged, one entry dead-lettered", func() bool {
		if client.XLen(ctx, "orders:dead").Val() != 1 {
			return false
		}
		pending, err := client.XPending(ctx, "orders", "shipping").Result()
		return err == nil && pending.Count == 0
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := shipped.Load(); n != 1 {
		t.Errorf("shipped %d times, want 1", n)
	}
}
