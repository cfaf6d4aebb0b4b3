package gateway

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestSecondaryKeepsItsConnections: during a Redis outage every request
// goes to the fallback PostgreSQL. With database/sql's default of 2 idle
// connections, most of 32 concurrent requests' statements opened a
// connection of their own and closed it after (a PostgreSQL backend
// started per statement: pgstore's doc measured 10× slower); the
// gateway's pool keeps its connections, so none is closed for want of
// idle room (DBStats.MaxIdleClosed).
func TestSecondaryKeepsItsConnections(t *testing.T) {
	rs := testenv.StartRedis(t)
	secondaryPostgres(t)
	cfg, _ := secondaryConfig(t, rs, "")
	e := startConfigured(t, cfg)
	outage(t, rs, e)
	before := e.gw.db.Stats().MaxIdleClosed
	const clients, each = 32, 8
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("k-%d-%d", c, i)
				if r := post(t, e.srv.URL+"/orders", key, `{"order":"`+key+`"}`, "X-Account-Id", "acct"); r.status != http.StatusCreated {
					errs <- fmt.Errorf("%s: %d", key, r.status)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := e.gw.db.Stats()
	t.Logf("secondary pool: %d open, %d closed for want of idle room, %d waits", st.OpenConnections, st.MaxIdleClosed-before, st.WaitCount)
	if n := st.MaxIdleClosed - before; n > 0 {
		t.Errorf("%d connections to the secondary were closed for want of idle room during %d requests: the pool churns", n, clients*each)
	}
}
