package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemguard/idemguard/guard"
	"github.com/idemguard/idemguard/httpx"
	"github.com/idemguard/idemguard/internal/testenv"
	"github.com/idemguard/idemguard/pgstore"
)

// TestOlderVersionForwardNotRunAgain: an older gateway (its rows in
// the fallback PostgreSQL under the bare scope) forwarded a request during
// a Redis outage and died before storing the answer: its row is pending,
// holds the forward step, and its lease ran out. After the upgrade the
// retry must find that step (outcome-unknown, as the older version itself
// would have answered), never forward the request again.
func TestOlderVersionForwardNotRunAgain(t *testing.T) {
	for _, redisUp := range []bool{true, false} {
		name := "redis-back"
		if !redisUp {
			name = "redis-still-down"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rs := testenv.StartRedis(t)
			db := secondaryPostgres(t)
			cfg, up := secondaryConfig(t, rs, "svc-a:")
			pg, err := pgstore.New(db, pgstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			// What the older version wrote: a claim under the bare scope,
			// its forward step, then nothing (the gateway died).
			body := `{"order":"pay-2"}`
			req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			key := guard.Key{Scope: `"acct9" POST /orders`, ID: "pay-2"}
			g := guard.New(pg, guard.Options{Lease: time.Second, TTL: time.Hour})
			out, err := g.Claim(ctx, key, httpx.DefaultFingerprint(req, []byte(body)))
			if err != nil || out.Status != guard.Acquired {
				t.Fatalf("claim: %+v, %v", out, err)
			}
			if _, err := guard.Step(ctx, out.Lease, forwardStep, func(context.Context) (int64, error) {
				return time.Now().UnixMilli(), nil // the older format: the time alone
			}); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 10*time.Second, "the dead holder's lease to run out", func() bool {
				rec, err := pg.Get(ctx, key)
				return err == nil && rec.LeaseLeft == 0
			})
			if !redisUp {
				rs.Kill()
			}
			e := startConfigured(t, cfg)
			if !redisUp {
				onSecondary(t, e)
			}
			r := post(t, e.srv.URL+"/orders", "pay-2", body, "X-Account-Id", "acct9")
			if n := up.count("pay-2"); n != 0 || r.status != http.StatusInternalServerError || r.problemType() != ProblemOutcomeUnknown {
				t.Fatalf("the retry of a request the older gateway forwarded: %d %s; the upstream ran it %d times after the upgrade; want 500 outcome-unknown, 0 runs", r.status, r.body, n)
			}
		})
	}
}
