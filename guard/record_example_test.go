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

// An operator tool reads records by their Redis names, as SCAN finds them.
// A completed record keeps no scope and ID; a pending or failed one does.
func ExampleRedisStore_GetByName() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	g := guard.New(store, guard.Options{})
	ctx := context.Background()

	done := guard.Key{Scope: "tenant-42/POST /orders", ID: "order-1"}
	if _, err := g.Do(ctx, done, "fp", func(context.Context, guard.Lease) ([]byte, error) { return []byte("ok"), nil }); err != nil {
		log.Fatal(err)
	}
	running := guard.Key{Scope: "tenant-42/POST /orders", ID: "order-2"}
	if _, err := g.Claim(ctx, running, "fp"); err != nil {
		log.Fatal(err)
	}

	names, _, err := client.Scan(ctx, 0, guard.DefaultPrefix+"{*}", 100).Result()
	if err != nil {
		log.Fatal(err)
	}
	for _, name := range []string{store.Name(done), store.Name(running)} {
		if !slices.Contains(names, name) {
			log.Fatalf("%s not found by SCAN", name)
		}
		rec, err := store.GetByName(ctx, name)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s fence %d key %q\n", rec.State, rec.Fence, rec.Key)
	}
	// Output:
	// completed fence 1 key "/"
	// pending fence 1 key "tenant-42/POST /orders/order-2"
}

// A record the store cannot read whole is an error naming the key, from
// every call; nothing runs.
func ExampleCorruptError() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	g := guard.New(store, guard.Options{})
	ctx := context.Background()

	key := guard.Key{Scope: "billing", ID: "invoice-7"}
	// A record of idemguard's first layout, a hash, under the same name.
	client.HSet(ctx, store.Name(key), "st", "c", "res", "paid")

	_, err := g.Do(ctx, key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
		fmt.Println("charging") // never printed
		return nil, nil
	})
	var ce *guard.CorruptError
	fmt.Println(errors.Is(err, guard.ErrCorrupt), errors.As(err, &ce) && ce.Key == key)
	// Output:
	// true true
}

// A RedisStore keeps a fingerprint longer than 16 bytes as a digest:
// compare a record's with SameFingerprint.
func ExampleRecord_SameFingerprint() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}), guard.Options{})
	ctx := context.Background()

	key := guard.Key{Scope: "POST /orders", ID: "k1"}
	fp := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" // SHA-256, as httpx makes them
	if _, err := g.Claim(ctx, key, fp); err != nil {
		log.Fatal(err)
	}
	rec, err := g.Get(ctx, key)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Fingerprint == fp, rec.SameFingerprint(fp), rec.SameFingerprint("another"))
	// Output:
	// false true false
}
