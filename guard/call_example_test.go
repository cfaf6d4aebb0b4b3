package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// One Guard serves callers with different attempt limits: a consumer
// that gives a message 2 tries, next to callers that use the guard's 5.
func ExampleGuard_DoWith() {
	mr := miniredis.NewMiniRedis() // any Redis
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}), guard.Options{MaxAttempts: 5})

	key := guard.Key{Scope: "consumer:billing", ID: "evt_1"}
	flaky := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		return nil, fmt.Errorf("attempt %d: provider down", lease.Attempt)
	}
	twoTries := guard.CallOptions{MaxAttempts: 2}
	for range 3 {
		_, err := g.DoWith(context.Background(), key, "fp", flaky, twoTries)
		if ex, ok := errors.AsType[*guard.ExhaustedError](err); ok {
			fmt.Println("dead-letter after", ex.Attempts, "attempts:", ex.LastError)
			break
		}
		fmt.Println(err)
	}
	// Output:
	// attempt 1: provider down
	// attempt 2: provider down
	// dead-letter after 2 attempts: attempt 2: provider down
}

// A duplicate that arrives while the first request runs waits for its
// result instead of being told to come back later.
func ExampleGuard_Wait() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}), guard.Options{})
	ctx := context.Background()
	key := guard.Key{Scope: "tenant-42/POST /charges", ID: "order-7"}

	first, err := g.Claim(ctx, key, "fp")
	if err != nil {
		log.Fatal(err)
	}
	go func() { // the first request's effect
		time.Sleep(50 * time.Millisecond)
		_ = g.Complete(ctx, first.Lease, []byte(`{"charge":"ch_1"}`))
	}()

	out, err := g.Claim(ctx, key, "fp") // the duplicate
	if errors.Is(err, guard.ErrInProgress) {
		out, err = g.Wait(ctx, key, "fp", guard.WaitOptions{Timeout: 5 * time.Second})
	}
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(out.Status, string(out.Result))
	// Output:
	// replay {"charge":"ch_1"}
}
