package gateway

import (
	"context"
	"net/http"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestReadyWhileRedisHangs: 04acd68 says /readyz is 200 under policy
// secondary "when Redis does not answer but the fallback PostgreSQL
// does". A Redis that hangs (paused, a partition that drops packets: no
// connection refused) holds /readyz's Redis ping until the probe's own
// 2s deadline; PostgreSQL is then pinged with that spent context, fails
// at once, and /readyz says 503 "secondary: unreachable: context deadline
// exceeded" while the secondary serves every guarded request (201).
func TestReadyWhileRedisHangs(t *testing.T) {
	rs := testenv.StartRedis(t)
	secondaryPostgres(t)
	cfg, up := secondaryConfig(t, rs, "")
	e := startConfigured(t, cfg)
	if err := rs.Client().Do(context.Background(), "CLIENT", "PAUSE", "15000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	onSecondary(t, e)
	r := post(t, e.srv.URL+"/orders", "h-1", `{"order":"h-1"}`, "X-Account-Id", "acct_1")
	if r.status != http.StatusCreated || up.count("h-1") != 1 {
		t.Fatalf("guarded request while Redis hangs: %d, upstream ran it %d times; want 201 and 1 (precondition)", r.status, up.count("h-1"))
	}
	code, res := checkReadyz(t, e.gw)
	t.Logf("/readyz: %d %+v", code, res)
	if code != http.StatusOK {
		t.Errorf("/readyz %d while Redis hangs and the gateway serves guarded requests from the secondary", code)
	}
}
