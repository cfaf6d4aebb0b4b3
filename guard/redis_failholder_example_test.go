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

// Free a key whose holder died, as idemguard release does: the holder's
// attempt is failed in its name, but only once its lease has run out,
// judged by Redis as it writes.
func ExampleRedisStore_FailHolder() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()
	store := guard.NewRedisStore(client, guard.RedisOptions{})
	ctx := context.Background()
	key := guard.Key{Scope: "payments", ID: "order-1"}
	out, err := store.Claim(ctx, guard.ClaimRequest{Key: key, Token: "T-1", Fingerprint: "fp", Lease: 10 * time.Second, TTL: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	rec, err := store.Get(ctx, key) // what an operator looks at
	if err != nil {
		log.Fatal(err)
	}
	holder := guard.Lease{Key: key, Token: rec.Token}

	err = store.FailHolder(ctx, holder, "released by an operator", time.Hour, false)
	fmt.Println("lease alive:", errors.Is(err, guard.ErrInProgress))

	mr.FastForward(11 * time.Second) // the holder died: its lease runs out
	fmt.Println("lease run out:", store.FailHolder(ctx, holder, "released by an operator", time.Hour, false))
	fmt.Println("its holder's completion:", store.Complete(ctx, out.Lease, []byte("ok"), time.Hour))
	// Output:
	// lease alive: true
	// lease run out: <nil>
	// its holder's completion: idemguard: lease lost
}
