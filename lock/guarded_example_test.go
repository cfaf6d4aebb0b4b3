package lock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/lock"
)

func ExampleGuarded() {
	// The guard's store and the lock's three nodes: embedded servers here.
	store, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	rdb := redis.NewClient(&redis.Options{Addr: store.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	l, stop := exampleLocker(lock.Options{}) // three embedded nodes
	defer stop()

	charge := func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		// Runs once per idempotency key, and never alongside another
		// key's charge of the same account.
		return []byte("charged 10"), nil
	}
	ctx := context.Background()
	key := guard.Key{Scope: "tenant-1 POST /charges", ID: "key-123"}
	for range 2 {
		res, err := g.Do(ctx, key, "fingerprint", lock.Guarded(l, "account:42", charge))
		fmt.Printf("%s replayed=%v err=%v\n", res.Value, res.Replayed, err)
	}
	// Output:
	// charged 10 replayed=false err=<nil>
	// charged 10 replayed=true err=<nil>
}

type accountKey struct{}

func ExampleGuardedBy() {
	store, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer store.Close()
	rdb := redis.NewClient(&redis.Options{Addr: store.Addr()})
	defer rdb.Close()
	g := guard.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), guard.Options{})

	l, stop := exampleLocker(lock.Options{}) // three embedded nodes
	defer stop()

	// The resource comes from the request's context (set by auth, say).
	byAccount := func(ctx context.Context, _ guard.Lease) (string, error) {
		acct, ok := ctx.Value(accountKey{}).(string)
		if !ok {
			return "", errors.New("no account")
		}
		return "account:" + acct, nil
	}
	fn := lock.GuardedBy(l, byAccount, func(ctx context.Context, lease guard.Lease) ([]byte, error) {
		return []byte("locked " + lock.FromContext(ctx).Name()), nil
	})
	ctx := context.WithValue(context.Background(), accountKey{}, "42")
	res, err := g.Do(ctx, guard.Key{Scope: "s", ID: "k"}, "fp", fn)
	fmt.Printf("%s %v\n", res.Value, err)
	// Output: locked account:42 <nil>
}
