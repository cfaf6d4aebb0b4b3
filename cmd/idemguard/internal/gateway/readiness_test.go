package gateway

import (
	"net/http"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestNotReadyWhileSecondaryUnreadable: under fallback policy
// secondary, a gateway that could not read its PostgreSQL at start refuses
// every fresh key Redis grants (503, nothing forwarded) while PostgreSQL
// cannot answer; /readyz must not then say 200, or a load balancer keeps
// sending it traffic it answers 503 to.
func TestNotReadyWhileSecondaryUnreadable(t *testing.T) {
	t.Setenv("IDEMGUARD_TEST_SECONDARY_PG", "postgres://u@127.0.0.1:1/db?sslmode=disable")
	up := newUpstream(t)
	e := startGateway(t, `upstream: {upstream}
redis: {addrs: ["{redis}"], prefix: "{prefix}"}
fallback: {policy: secondary, postgres_env: IDEMGUARD_TEST_SECONDARY_PG}
defaults: {caller: {header: X-Account-Id}}
routes: [{pattern: POST /orders}]
`, up.URL)
	r := post(t, e.srv.URL+"/orders", "o-1", `{"order":"o-1"}`, "X-Account-Id", "acct_1")
	if r.status != http.StatusServiceUnavailable || up.count("o-1") != 0 {
		t.Fatalf("guarded request: %d, upstream ran it %d times; want 503 and 0 (precondition)", r.status, up.count("o-1"))
	}
	code, res := checkReadyz(t, e.gw)
	t.Logf("/readyz: %d %+v", code, res)
	if code == http.StatusOK {
		t.Errorf("/readyz 200 while every guarded request is answered 503 (the secondary cannot be read to check Redis's claims)")
	}
}

// TestReadyWhileSecondaryServes: under fallback policy secondary,
// with Redis down and the breaker open, the gateway serves guarded
// requests from PostgreSQL (201, forwarded once); /readyz must not say
// 503, or every replica is taken out of service for the very outage the
// secondary policy exists for.
func TestReadyWhileSecondaryServes(t *testing.T) {
	rs := testenv.StartRedis(t)
	secondaryPostgres(t)
	cfg, up := secondaryConfig(t, rs, "")
	e := startConfigured(t, cfg)
	outage(t, rs, e)
	r := post(t, e.srv.URL+"/orders", "s-1", `{"order":"s-1"}`, "X-Account-Id", "acct_1")
	if r.status != http.StatusCreated || up.count("s-1") != 1 {
		t.Fatalf("guarded request during the outage: %d, upstream ran it %d times; want 201 and 1 (precondition)", r.status, up.count("s-1"))
	}
	code, res := checkReadyz(t, e.gw)
	t.Logf("/readyz: %d %+v", code, res)
	if code != http.StatusOK {
		t.Errorf("/readyz %d while the gateway serves guarded requests from the secondary", code)
	}
}
