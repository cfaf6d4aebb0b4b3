package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// At start-up, refuse a Redis that may evict records. (miniredis, used
// here so the example runs anywhere, never evicts but cannot report a
// policy either: Check says so.)
func ExampleRedisStore_Check() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	ctx := context.Background()
	if err := store.LoadScripts(ctx); err != nil {
		log.Fatal(err)
	}

	err = store.Check(ctx, guard.CheckOptions{})
	var evicts *guard.EvictionError
	switch {
	case errors.As(err, &evicts):
		log.Fatalf("configure %s with maxmemory-policy noeviction (it has %s)", evicts.Addr, evicts.Policy)
	case errors.Is(err, guard.ErrUnavailable):
		log.Fatal("Redis is down: ", err)
	case err != nil:
		fmt.Println("policy unknown:", errors.Is(err, guard.ErrEviction))
	default:
		fmt.Println("noeviction")
	}
	// Output: policy unknown: false
}

// A readiness check that asks the server for the scripts the store sends:
// on Redis 7 those that end a claim carry the allow-oom flag line, and on
// miniredis, which cannot compile it, the store sends them plain once it
// met the refusal (here, in LoadScripts).
func ExampleRedisStore_Scripts() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	ctx := context.Background()
	if err := store.LoadScripts(ctx); err != nil {
		log.Fatal(err)
	}

	var hashes []string
	for _, sc := range store.Scripts() {
		hashes = append(hashes, sc.Hash())
	}
	loaded, err := client.ScriptExists(ctx, hashes...).Result()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(loaded), "scripts, all loaded:", !slices.Contains(loaded, false))
	// Output: 8 scripts, all loaded: true
}
