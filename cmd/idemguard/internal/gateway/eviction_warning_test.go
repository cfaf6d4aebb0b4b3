package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestAcceptedEvictionWarnsOnce: with redis.accept_eviction the gateway
// warns once, at start, that Redis may evict records (CheckOptions'
// "one warning"); /readyz, which checks the policy on every probe, says
// so in its answer, not with the warning again at each probe (a probe
// every few seconds buried the log in it).
func TestAcceptedEvictionWarnsOnce(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "allkeys-lru")
	cfg, err := Parse("gw.yaml", []byte(`upstream: http://127.0.0.1:1
redis: {addrs: ["`+srv.Addr()+`"], accept_eviction: true}
routes: [{pattern: POST /o, caller: {single: true}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	gw, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	if err := gw.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if code, r := checkReadyz(t, gw); code != http.StatusOK || !strings.Contains(r.Checks["eviction"], "accepted") {
			t.Fatalf("/readyz: %d %+v", code, r)
		}
	}
	if n := strings.Count(logs.String(), "may evict idempotency records"); n != 1 {
		t.Errorf("%d eviction warnings after start and three probes, want 1:\n%s", n, logs.String())
	}
}

// TestEvictionFoundLaterWarnsOnce: a policy that starts to evict after
// start (a Redis reconfigured, or unreachable at start) is warned of
// once, when a probe finds it (a probe that kept quiet because the start
// had warned kept quiet for good: nothing said it).
func TestEvictionFoundLaterWarnsOnce(t *testing.T) {
	srv := testenv.StartRedis(t, "--maxmemory-policy", "noeviction")
	cfg, err := Parse("gw.yaml", []byte(`upstream: http://127.0.0.1:1
redis: {addrs: ["`+srv.Addr()+`"], accept_eviction: true}
routes: [{pattern: POST /o, caller: {single: true}}]
`))
	if err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	gw, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	if err := gw.Prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, before := checkReadyz(t, gw)
	// The server (this test's own) is reconfigured to evict.
	if err := srv.Client().ConfigSet(context.Background(), "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	var after readiness
	for range 3 {
		var code int
		if code, after = checkReadyz(t, gw); code != http.StatusOK {
			t.Fatalf("/readyz: %d %+v", code, after)
		}
	}
	if warned := strings.Count(logs.String(), "may evict idempotency records"); warned != 1 {
		t.Errorf("Redis evicts since start (allkeys-lru): %d warnings after three probes, want 1 (/readyz says %q, as under noeviction: %q)\nlog:\n%s",
			warned, after.Checks["eviction"], before.Checks["eviction"], logs.String())
	}
}
