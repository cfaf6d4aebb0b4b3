package gateway

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestSecondaryOlderVersionRowsKeptForCenturies: the fallback PostgreSQL
// holds a row an older gateway version kept (bare scope) for key pay-1, completed
// during an outage, and, in the same table, a bare-scope row of an
// application's own pgstore/backstop kept "for ever" (expiring in 250 or
// 300 years; design.md: "Rows under a bare scope are also what an
// application's own pgstore.Store or backstop writes in the same table").
// The upgraded gateway, started with Redis back, must honour the older
// version's rows until the last expires (secondaryscope.go,
// docs/design.md "an upgrade after an outage runs no effect twice"): the
// retry of pay-1 is replayed. consultSecondary turned the far expiry into a
// negative duration (300 y: time.Duration overflow) or a time whose
// UnixNano wrapped (250 y: past 2262, honourLegacy), so the older rows
// were taken as expired and the upstream ran pay-1 a second time.
func TestSecondaryOlderVersionRowsKeptForCenturies(t *testing.T) {
	for _, years := range []int{250, 300} {
		t.Run(strconv.Itoa(years)+"y", func(t *testing.T) {
			rs := testenv.StartRedis(t)
			db := secondaryPostgres(t)
			cfg, up := secondaryConfig(t, rs, "svc-a:")
			pay := func(e *gwEnv) reply {
				return post(t, e.srv.URL+"/orders", "pay-1", `{"order":"pay-1"}`, "X-Account-Id", "acct9")
			}
			old := startConfigured(t, cfg)
			outage(t, rs, old)
			if r := pay(old); r.status != http.StatusCreated || up.count("pay-1") != 1 {
				t.Fatalf("during the outage: %d, upstream ran it %d times; want 201 once", r.status, up.count("pay-1"))
			}
			_ = old.gw.Close()
			// What the older version wrote: the same rows, under the bare scope.
			tag := SecondaryScopeTag("svc-a:")
			if _, err := db.Exec(`UPDATE idemguard_keys SET scope = substr(scope, char_length($1) + 1) WHERE starts_with(scope, $1)`, tag); err != nil {
				t.Fatal(err)
			}
			// An application's own row in the same table (a bare scope of its
			// own), kept for centuries: the probes' rows, renamed.
			res, err := db.Exec(`UPDATE idemguard_keys SET scope = 'billing-app', expires_at = statement_timestamp() + make_interval(years => $1) WHERE id LIKE 'probe-%'`, years)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := res.RowsAffected(); n == 0 {
				t.Fatal("no probe row to turn into the application's")
			}
			rs.Restart()
			e := startConfigured(t, cfg)
			if r := pay(e); r.status != http.StatusCreated || !r.replayed() || up.count("pay-1") != 1 {
				t.Fatalf("upgraded, Redis back, an application row expiring in %d years beside the older rows: %d (replayed %t), upstream ran pay-1 %d times; want the stored 201 replayed, once", years, r.status, r.replayed(), up.count("pay-1"))
			}
		})
	}
}
