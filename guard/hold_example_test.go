package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
)

// An adapter that answers replays itself before it runs a handler: Hold
// claims the key and keeps the lease alive while the handler runs under
// its Context, and Complete stores what the handler answered.
func ExampleGuard_Hold() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	g := guard.New(guard.NewRedisStore(client, guard.RedisOptions{}), guard.Options{})

	serve := func(ctx context.Context, id string) string {
		out, held, err := g.Hold(ctx, guard.Key{Scope: "tenant-42/POST /orders", ID: id}, "fp")
		var busy *guard.InProgressError
		switch {
		case errors.As(err, &busy):
			return "409 still running"
		case err != nil:
			return "503 " + err.Error()
		case out.Status == guard.Replay:
			return "replayed " + string(out.Result)
		}
		defer held.Stop() // a handler that panics: the lease runs out
		// The handler runs under held.Context(), fenced by held.Lease().Fence.
		answer := fmt.Sprintf("201 order %d", held.Lease().Fence)
		if err := held.Complete([]byte(answer)); err != nil {
			return "500 " + err.Error()
		}
		return answer
	}
	fmt.Println(serve(context.Background(), "order-1"))
	fmt.Println(serve(context.Background(), "order-1"))
	// Output:
	// 201 order 1
	// replayed 201 order 1
}

// A lease that Claim or Wait acquired, held as Hold holds its own: kept
// alive while the effect runs under the Held's Context, and ended by
// Complete, which ends the Context too.
func ExampleGuard_Keep() {
	mr, err := miniredis.Run()
	if err != nil {
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
	held := g.Keep(ctx, out.Lease)
	defer held.Stop()
	fmt.Println("sending, context", held.Context().Err())
	if err := held.Complete([]byte("sent")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after Complete, context", held.Context().Err())
	out, _ = g.Claim(ctx, key, "")
	fmt.Println(out.Status, string(out.Result))
	// Output:
	// sending, context <nil>
	// after Complete, context context canceled
	// replay sent
}
