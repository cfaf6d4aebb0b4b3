package promx_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/fallback"
	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/promx"
)

// Time the Redis store under a fallback: the timed store keeps the
// RedisStore's steps and tells the fallback its calls end by their
// deadline, so wrapping costs the fallback nothing.
func ExampleMetrics_Store_fallback() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	m, err := promx.New(prometheus.NewRegistry(), promx.Options{})
	if err != nil {
		panic(err)
	}
	timed := m.Store(guard.NewRedisStore(rdb, guard.RedisOptions{}))
	store, err := fallback.New(timed, fallback.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	g := guard.New(store, guard.Options{Observer: m})

	res, err := g.Do(context.Background(), guard.Key{Scope: "payments", ID: "order-1"}, "fp",
		func(ctx context.Context, l guard.Lease) ([]byte, error) {
			id, err := guard.Step(ctx, l, "charge", func(context.Context) (string, error) { return "ch_1", nil })
			return []byte(id), err
		})
	fmt.Println(string(res.Value), err, m.Count(guard.EventCompleted))
	// Output:
	// ch_1 <nil> 1
}
