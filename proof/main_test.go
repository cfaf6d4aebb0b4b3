package proof

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/idemguard/idemguard/guard"
)

var soak = flag.Bool("soak", false, "run the long soak tests (many seeds, long histories)")

func TestMain(m *testing.M) {
	// Toxiproxy's own logs (the bandwidth toxic logs through the global
	// logger) would drown the test output.
	zerolog.SetGlobalLevel(zerolog.Disabled)
	// Toxiproxy 2.5 leaves a link's first stub blocked on a send when a
	// toxic after it (reset_peer, limit_data, timeout) closed the link
	// while data was still arriving; the goroutine outlives the proxy.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"))
}

// faultyClient is a client tuned to meet faults quickly: short timeouts,
// go-redis' default of 3 retries with short backoff, so a dropped reply
// is retried (the script runs twice) within milliseconds.
func faultyClient(t testing.TB, addr string, pool int) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: addr, PoolSize: pool,
		DialTimeout: 250 * time.Millisecond, ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond,
		MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 20 * time.Millisecond,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// startProxy starts a proxy in front of addr, closed when the test ends.
func startProxy(t testing.TB, addr string) *Proxy {
	t.Helper()
	p, err := NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// redisStore returns a store on c with its scripts loaded.
func redisStore(t testing.TB, c redis.UniversalClient, prefix string) *guard.RedisStore {
	t.Helper()
	return redisStoreWith(t, c, guard.RedisOptions{Prefix: prefix})
}

// redisStoreWith is redisStore with options o.
func redisStoreWith(t testing.TB, c redis.UniversalClient, o guard.RedisOptions) *guard.RedisStore {
	t.Helper()
	s := guard.NewRedisStore(c, o)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatalf("load scripts: %v", err)
	}
	return s
}
