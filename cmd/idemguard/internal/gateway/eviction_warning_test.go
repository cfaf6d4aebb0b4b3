package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// acceptingGateway starts a gateway with redis.accept_eviction on a Redis
// of the test's own with maxmemory-policy policy, and returns it, that
// Redis and the gateway's log.
func acceptingGateway(t *testing.T, policy string) (*Gateway, *testenv.Server, *testenv.Buffer) {
	t.Helper()
	srv := testenv.StartRedis(t, "--maxmemory-policy", policy)
	cfg, err := Parse("gw.yaml", []byte(`upstream: http://127.0.0.1:1
redis: {addrs: ["`+srv.Addr()+`"], accept_eviction: true}
routes: [{pattern: POST /o, caller: {single: true}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	gw, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	if err := gw.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	return gw, srv, logs
}

// probeReady asks /readyz n times; each must answer ready, its eviction
// check accepted.
func probeReady(t *testing.T, gw *Gateway, n int) readiness {
	t.Helper()
	var r readiness
	for range n {
		var code int
		if code, r = checkReadyz(t, gw); code != http.StatusOK || !strings.Contains(r.Checks["eviction"], "accepted") {
			t.Fatalf("/readyz: %d %+v", code, r)
		}
	}
	return r
}

// evictionWarnings counts the eviction warnings in logs.
func evictionWarnings(logs *testenv.Buffer) int {
	return strings.Count(logs.String(), "may evict idempotency records")
}

// TestAcceptedEvictionWarnsOnce: with redis.accept_eviction the gateway
// warns once, at start, that Redis may evict records (CheckOptions'
// "one warning"); /readyz, which checks the policy on every probe, says
// so in its answer, not with the warning again at each probe (a probe
// every few seconds buried the log in it).
func TestAcceptedEvictionWarnsOnce(t *testing.T) {
	gw, _, logs := acceptingGateway(t, "allkeys-lru")
	probeReady(t, gw, 3)
	if n := evictionWarnings(logs); n != 1 {
		t.Errorf("%d eviction warnings after start and three probes, want 1:\n%s", n, logs.String())
	}
}

// TestEvictionFoundLaterWarnsOnce: a policy that starts to evict after
// start (a Redis reconfigured, or unreachable at start) is warned of
// once, when a probe finds it (a probe that kept quiet because the start
// had warned kept quiet for good: nothing said it).
func TestEvictionFoundLaterWarnsOnce(t *testing.T) {
	gw, srv, logs := acceptingGateway(t, "noeviction")
	probeReady(t, gw, 1)
	if err := srv.Client().ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	probeReady(t, gw, 3)
	if n := evictionWarnings(logs); n != 1 {
		t.Errorf("Redis evicts since start (allkeys-lru): %d warnings after three probes, want 1:\n%s", n, logs.String())
	}
}

// TestEvictionBackWarnsAgain: a policy warned of, then changed to
// noeviction, then back, is warned of again when a probe finds it back
// (the warning is logged whenever the policies change; the last warning
// was remembered past the noeviction that ended it, and the policy's
// return went unsaid).
func TestEvictionBackWarnsAgain(t *testing.T) {
	gw, srv, logs := acceptingGateway(t, "allkeys-lru")
	policy := func(p string) {
		t.Helper()
		if err := srv.Client().ConfigSet(context.Background(), "maxmemory-policy", p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	policy("noeviction")
	probeReady(t, gw, 2)
	policy("allkeys-lru")
	probeReady(t, gw, 2)
	if n := evictionWarnings(logs); n != 2 {
		t.Errorf("allkeys-lru, noeviction, allkeys-lru again: %d warnings, want 2:\n%s", n, logs.String())
	}
}
