package proof

import (
	"flag"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

var soak = flag.Bool("soak", false, "run the long soak tests (many seeds, long histories)")

// TestMain checks that no test leaves a goroutine behind.
//
// The drills (a storm against servers of their own, faulted, then the
// effects counted) and the tests whose child processes are killed run in
// parallel with one another (t.Parallel), after every other test: they
// wait on leases, restarts and children far longer than they compute,
// and what they check is counts, not timing. The partition, pause and
// nemesis tests, which time a holder's cancellation to the millisecond,
// the Redlock drill, whose rounds are bounded to 125 ms, and the steps'
// abandon test, whose holders keep 1 s leases (beside the drills, 4 of
// its 200 heartbeats once came too late), run first, one at a time, on a
// CPU nothing else here uses.
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
