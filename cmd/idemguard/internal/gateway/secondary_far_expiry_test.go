package gateway

import (
	"net/http"
	"strconv"
	"testing"
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
			o := olderVersionOutage(t)
			db, cfg, up, pay, rs := o.db, o.cfg, o.up, o.pay, o.rs
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
