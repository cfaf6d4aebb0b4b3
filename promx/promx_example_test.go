package promx_test

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
	"github.com/idemguard/idemguard/promx"
)

func Example() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	reg := prometheus.NewRegistry()
	m, err := promx.New(reg, promx.Options{})
	if err != nil {
		panic(err)
	}
	g := guard.New(m.Store(guard.NewRedisStore(client, guard.RedisOptions{})), guard.Options{Observer: m})

	key := guard.Key{Scope: "POST /payments", ID: "order-42"}
	for range 3 {
		_, _ = g.Do(context.Background(), key, "fp", func(context.Context, guard.Lease) ([]byte, error) {
			return []byte("charged"), nil
		})
	}
	fmt.Println("acquired:", m.Count(guard.EventAcquired))
	fmt.Println("replayed:", m.Count(guard.EventReplayed))
	fams, _ := reg.Gather()
	for _, f := range fams {
		fmt.Println(f.GetName())
	}
	// Output:
	// acquired: 1
	// replayed: 2
	// idemguard_outcomes_total
	// idemguard_store_duration_seconds
}

// Count outcomes and log replays and conflicts with one observer
// (metrics.Tee).
func Example_tee() {
	reg := prometheus.NewRegistry()
	m, err := promx.New(reg, promx.Options{})
	if err != nil {
		panic(err)
	}
	logs := metrics.NewLogger(slog.New(slog.DiscardHandler), metrics.LogOptions{})
	obs := metrics.Tee(m, logs)
	obs.Observe(context.Background(), guard.Event{Kind: guard.EventReplayed, Key: guard.Key{Scope: "s", ID: "i"}})
	fmt.Println("replayed:", m.Count(guard.EventReplayed))
	// Output:
	// replayed: 1
}
