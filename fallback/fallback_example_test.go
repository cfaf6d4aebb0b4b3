package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
)

// A guard that fails closed when Redis goes away: the effect does not run
// and the caller gets guard.ErrUnavailable (httpx answers 503); once the
// breaker is open, Redis is not called at all.
func ExampleNew() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	defer mr.Close()
	// One dial attempt, no command retries: the breaker does the retrying.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialerRetries: 1, MaxRetries: -1})
	defer rdb.Close()

	store, err := fallback.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), fallback.Options{
		Timeout:        time.Second, // a store call never takes longer
		FailuresToOpen: 1,
		Logger:         slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err) // options from configuration: an unknown policy, a missing secondary
	}
	g := guard.New(store, guard.Options{})
	charge := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		return []byte("charged"), nil
	}
	ctx := context.Background()

	res, err := g.Do(ctx, guard.Key{Scope: "payments", ID: "order-1"}, "fp", charge)
	fmt.Println(string(res.Value), err)

	mr.Close() // Redis goes away
	_, err = g.Do(ctx, guard.Key{Scope: "payments", ID: "order-2"}, "fp", charge)
	fmt.Println("unavailable:", errors.Is(err, guard.ErrUnavailable), "breaker:", store.State())
	// Output:
	// charged <nil>
	// unavailable: true breaker: open
}

// The Secondary policy: while Redis is down, keys are claimed in a
// secondary store (in production the Postgres Store of pgstore; a
// second miniredis here). When Redis comes back empty, a retry of a key
// completed during the outage replays instead of running again.
func ExampleNew_secondary() {
	primary, secondary := miniredis.NewMiniRedis(), miniredis.NewMiniRedis()
	for _, m := range []*miniredis.Miniredis{primary, secondary} {
		if err := m.Start(); err != nil {
			panic(err)
		}
		defer m.Close()
	}
	client := func(m *miniredis.Miniredis) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: m.Addr(), DialerRetries: 1, MaxRetries: -1})
	}
	p, s := client(primary), client(secondary)
	defer p.Close()
	defer s.Close()

	store, err := fallback.New(guard.NewRedisStore(p, guard.RedisOptions{}), fallback.Options{
		Policy:         fallback.Secondary,
		Secondary:      guard.NewRedisStore(s, guard.RedisOptions{}),
		Timeout:        time.Second,
		FailuresToOpen: 1,
		OpenTimeout:    250 * time.Millisecond,
		Logger:         slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	g := guard.New(store, guard.Options{})
	runs := 0
	charge := func(ctx context.Context, l guard.Lease) ([]byte, error) {
		runs++
		return []byte("charged"), nil
	}
	ctx := context.Background()
	key := guard.Key{Scope: "payments", ID: "order-7"}

	primary.Close()                          // Redis goes away
	_, _ = store.Get(ctx, key)               // the failure that opens the breaker
	res, err := g.Do(ctx, key, "fp", charge) // claimed and completed in the secondary
	fmt.Println("during the outage:", string(res.Value), err, "replayed:", res.Replayed)

	if err := primary.Restart(); err != nil { // Redis is back, and has forgotten everything
		panic(err)
	}
	primary.FlushAll()
	for store.State() == fallback.StateOpen {
		time.Sleep(5 * time.Millisecond) // waiting for the open timeout to pass
	}
	res, err = g.Do(ctx, key, "fp", charge)
	fmt.Println("after the outage:", string(res.Value), err, "replayed:", res.Replayed, "runs:", runs)
	// Output:
	// during the outage: charged <nil> replayed: false
	// after the outage: charged <nil> replayed: true runs: 1
}

// The breaker's state, read with State or followed with OnStateChange
// (for a gauge or an alert), in fallback's own types.
func ExampleStore_State() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialerRetries: 1, MaxRetries: -1})
	defer rdb.Close()

	changes := make(chan string, 4)
	store, err := fallback.New(guard.NewRedisStore(rdb, guard.RedisOptions{}), fallback.Options{
		Timeout:        200 * time.Millisecond,
		FailuresToOpen: 1,
		Logger:         slog.New(slog.DiscardHandler),
		OnStateChange: func(from, to fallback.State) {
			changes <- from.String() + " → " + to.String()
		},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	fmt.Println(store.State())

	mr.Close() // Redis goes away: the next call fails and opens the breaker
	_, err = store.Get(ctx, guard.Key{Scope: "payments", ID: "order-1"})
	fmt.Println(<-changes, errors.Is(err, guard.ErrUnavailable))

	_, err = store.Get(ctx, guard.Key{Scope: "payments", ID: "order-1"}) // not sent to Redis
	fmt.Println(store.State(), errors.Is(err, fallback.ErrBreakerOpen))
	// Output:
	// closed
	// closed → open true
	// open true
}
