package metrics_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/metrics"
)

func Example() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer client.Close()

	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{})
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

func ExampleNewLogger() {
	h := slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // a fixed output for the example
			}
			return a
		},
	})
	log := metrics.NewLogger(slog.New(h), metrics.LogOptions{})
	key := guard.Key{Scope: "orders-consumer", ID: "msg-7"}
	log.Observe(context.Background(), guard.Event{Kind: guard.EventAcquired, Key: key, Attempt: 1})
	log.Observe(context.Background(), guard.Event{Kind: guard.EventReplayed, Key: key})
	log.Observe(context.Background(), guard.Event{Kind: guard.EventMismatch, Key: key})
	// Output:
	// level=INFO msg="idemguard replayed" event=replayed scope=orders-consumer key=9d9fd7fb17ce
	// level=WARN msg="idemguard mismatch" event=mismatch scope=orders-consumer key=9d9fd7fb17ce
}

// Keys are logged as a digest unless LogKeys; the digest is the same in
// every process, so one key's records can be found by computing it.
func ExampleKeyDigest() {
	key := guard.Key{Scope: "orders-consumer", ID: "msg-7"}
	fmt.Println(metrics.KeyDigest(key))
	// Output: 9d9fd7fb17ce
}

// Count outcomes and log replays and conflicts with one observer.
func ExampleTee() {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{})
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
