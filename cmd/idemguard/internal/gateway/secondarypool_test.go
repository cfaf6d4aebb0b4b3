package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemguard/idemguard/internal/testenv"
)

// TestSecondaryKeepsItsConnections: during a Redis outage every request
// goes to the fallback PostgreSQL. With database/sql's default of 2 idle
// connections, most of 32 concurrent requests' statements opened a
// connection of their own and closed it after (a PostgreSQL backend
// started per statement: pgstore's doc measured 10× slower); the
// gateway's pool keeps its connections, so none is closed for want of
// idle room (DBStats.MaxIdleClosed).
//
// A 503 or 409 is retried after its Retry-After, as a client would: on
// a loaded machine (make test) a burst of 32 new PostgreSQL backends once
// took longer than the secondary's 2 s bound, and the gateway rightly
// answered 503 "store unavailable" to 10 of the first requests; a claim
// that reached the secondary after its bound holds its key in progress
// (409) until its lease ends. What the test counts is the pool's churn,
// which retries add to if anything.
func TestSecondaryKeepsItsConnections(t *testing.T) {
	rs := testenv.StartRedis(t)
	secondaryPostgres(t)
	cfg, _ := secondaryConfig(t, rs, "")
	e := startConfigured(t, cfg)
	outage(t, rs, e)
	before := e.gw.db.Stats().MaxIdleClosed
	const clients, each = 32, 8
	var (
		wg      sync.WaitGroup
		retried atomic.Int64
	)
	errs := make(chan error, clients*each)
	for c := range clients {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("k-%d-%d", c, i)
				r := post(t, e.srv.URL+"/orders", key, `{"order":"`+key+`"}`, "X-Account-Id", "acct")
				for deadline := time.Now().Add(time.Minute); (r.status == http.StatusServiceUnavailable || r.status == http.StatusConflict) && time.Now().Before(deadline); {
					retried.Add(1)
					wait, err := strconv.Atoi(r.header.Get("Retry-After"))
					if err != nil {
						t.Errorf("%s: %d without a Retry-After", key, r.status)
						break
					}
					time.Sleep(min(time.Duration(wait)*time.Second, 2*time.Second)) // the client's backoff
					r = post(t, e.srv.URL+"/orders", key, `{"order":"`+key+`"}`, "X-Account-Id", "acct")
				}
				if r.status != http.StatusCreated {
					errs <- fmt.Errorf("%s: %d %s", key, r.status, r.body)
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
	t.Logf("secondary pool: %d open, %d closed for want of idle room, %d waits; %d 503s and 409s retried", st.OpenConnections, st.MaxIdleClosed-before, st.WaitCount, retried.Load())
	if n := st.MaxIdleClosed - before; n > 0 {
		t.Errorf("%d connections to the secondary were closed for want of idle room during %d requests: the pool churns", n, clients*each)
	}
}
