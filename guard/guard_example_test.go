package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// A charge runs once however often the request behind it arrives.
func ExampleGuard_Do() {
	mr := miniredis.NewMiniRedis() // any Redis: standalone, Sentinel or Cluster
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	store := guard.NewRedisStore(client, guard.RedisOptions{})
	if err := store.LoadScripts(context.Background()); err != nil {
		log.Fatal(err)
	}
	g := guard.New(store, guard.Options{})

	key := guard.Key{Scope: "tenant-42/POST /charges", ID: "5f1c0a7e-retry-safe"}
	charge := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		fmt.Println("charging card, fence", lease.Fence)
		return []byte(`{"charge":"ch_1","amount":500}`), nil
	}
	for range 3 { // the client retries twice
		res, err := g.Do(context.Background(), key, "sha256-of-request", charge)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s replayed=%v\n", res.Value, res.Replayed)
	}

	_, err := g.Do(context.Background(), key, "another-request", charge)
	fmt.Println(errors.Is(err, guard.ErrMismatch))
	// Output:
	// charging card, fence 1
	// {"charge":"ch_1","amount":500} replayed=false
	// {"charge":"ch_1","amount":500} replayed=true
	// {"charge":"ch_1","amount":500} replayed=true
	// true
}

// The steps of Do, for callers that run the effect elsewhere.
func ExampleGuard_Claim() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}), guard.Options{})
	ctx := context.Background()
	key := guard.Key{Scope: "emails", ID: "welcome/user-7"}

	out, err := g.Claim(ctx, key, "")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(out.Status, out.Lease.Attempt)
	_, err = g.Claim(ctx, key, "")
	fmt.Println(errors.Is(err, guard.ErrInProgress))
	if err := g.Complete(ctx, out.Lease, []byte("sent")); err != nil {
		log.Fatal(err)
	}
	out, _ = g.Claim(ctx, key, "")
	fmt.Println(out.Status, string(out.Result))
	// Output:
	// acquired 1
	// true
	// replay sent
}

// Many goroutines on one store: past RedisOptions.DirectCalls calls under
// way, their scripts share pipelines, and each key's effect still runs once.
func ExampleNewRedisStore() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close() // also stops the client's autopipeliner

	store := guard.NewRedisStore(client, guard.RedisOptions{
		Prefix:      "payments:",
		DirectCalls: 4, // the default is DefaultDirectCalls; Unpipelined: true turns sharing off
	})
	g := guard.New(store, guard.Options{})

	var effects atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 { // 8 keys, 8 copies of each at once
		wg.Go(func() {
			key := guard.Key{Scope: "orders", ID: fmt.Sprint(i % 8)}
			_, err := g.Do(context.Background(), key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
				effects.Add(1)
				return []byte("ok"), nil
			})
			if err != nil && !errors.Is(err, guard.ErrInProgress) { // in progress: its copy answers
				log.Fatal(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("effects:", effects.Load())
	// Output:
	// effects: 8
}
