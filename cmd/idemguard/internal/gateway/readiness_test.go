package gateway

import (
	"net/http"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

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
